"""srun.sh's health check: check.py on every rank (as launcher/health.py), report.py on the launching host."""
