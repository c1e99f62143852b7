"""The launcher's parts: what entrypoint.py does before it hands a config to Megatron Bridge (the Python modules), and
the rank side and batch jobs of srun.sh (rank.sh, sbatch.sh, which srun.sh sources)."""
