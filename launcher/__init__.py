"""The launcher's parts, a folder per concern. A launch is two programs: srun.sh hands the launching host's work to
host/supervisor.py, and every rank runs rank/rank.sh, then entrypoint.py.

    host/      the launching host: checks, the job and its run folder, the commands, signals, reports, batch jobs
    rank/      what a rank does before its program starts, and installs before pretrain()
    config/    the rank's config: the grammar of NAME=VALUE, configure() and overrides, checks, data, the run's outputs
    hang/      the hang watch, the ranks' answers and the hang report
    health/    the health check, a tool of its own: the ranks' program and the host's verdict
    restart/   in-process restart and straggler detection
    assignments.py  the NAME=VALUE arguments, split and checked alike on both sides
    errors.py       the refusal of bad input: one line, exit status 2; values quoted for a shell
    run_files.py    the run folder's shared files, by name
"""
