# shellcheck shell=bash disable=SC2034  # what it sets (HEALTH_CMD) srun.sh reads
# srun.sh's health check (`--health`, or SRUNSH_HEALTH=1 before a launch or a batch job): every rank runs
# launcher/health.py
# in the launch's own srun step (geometry, container, environment), and launcher/health_report.py on this host
# enforces each part's deadline and prints the table. A batch job whose check fails requeues itself without the
# nodes that failed (health/failed-nodes: the condemned ones; a suspect node is named, not excluded, and passes). Sourced by srun.sh, whose variables and helpers (die, q, launch, requeue_batch_job) it uses.

# HEALTH_CMD: the launch command with launcher/health.py as every rank's program.
health_check_command() {
  local training=("${RANK_CMD[@]}")
  RANK_CMD=("$CODE_DIR/srun.sh" --rank-exec "$SRUNSH_PYTHON" "$CODE_DIR/launcher/health.py")
  launch_command
  HEALTH_CMD=("${LAUNCH_CMD[@]}")
  RANK_CMD=("${training[@]}")
  launch_command
}

# Runs the check; returns only when every node passed and a launch follows. Otherwise exits: 0 or 1 with --health,
# 1 after a failed check (a batch job first requeues itself without the nodes that failed).
check_health() {
  local status=0 nodes
  printf -v nodes '%s,' "${HOSTS[@]}"
  echo "# srun.sh: health check of ${#HOSTS[@]} node(s) x $SRUNSH_GPUS_PER_NODE rank(s), each part within" \
    "${SRUNSH_HEALTH_TIMEOUT_S}s (SRUNSH_HEALTH_TIMEOUT_S)" >&2
  rm -f -- "$HOST_RUN_DIR/health.json"
  launch python3 "$REPO_DIR/launcher/health_report.py" "$HOST_RUN_DIR" --timeout "$SRUNSH_HEALTH_TIMEOUT_S" \
    --nodes "${nodes%,}" --ranks-per-node "$SRUNSH_GPUS_PER_NODE" -- "${HEALTH_CMD[@]}" || status=$?
  rm -f -- "$HOST_RUN_DIR"/logs/rank-*.status # the check's ranks': the launch's own first-failure report reads these
  [[ -z $STOPPED_BY ]] || exit $((128 + $(kill -l "$STOPPED_BY")))
  if [[ ! -s $HOST_RUN_DIR/health.json ]]; then
    echo "srun.sh: the health check ended before it judged the nodes; the end of $HOST_RUN_DIR/logs/launcher.log:" >&2
    tail -n 20 -- "$HOST_RUN_DIR/logs/launcher.log" | sed 's/^/    /' >&2
    exit 1
  fi
  ((!HEALTH_ONLY)) || exit "$status"
  ((status)) || return 0
  ((BATCH_JOB)) || exit "$status"
  local failed
  failed=$(cat -- "$HOST_RUN_DIR/health/failed-nodes" 2>/dev/null) || true
  requeue_batch_job "$status" "failed the health check${failed:+ on $failed}" || exit $?
  [[ -z $failed ]] || exclude_nodes "$failed"
  exit "$status"
}

# NODES join the excluded nodes of this job, pending again after its requeue (SLURM changes ExcNodeList of a pending
# job only). The requeue's SIGTERM reaches this script and its children meanwhile: they ignore it.
exclude_nodes() {
  (
    trap '' TERM
    excluded=$(scontrol show job --oneliner "$SLURM_JOB_ID" | sed -n 's/.* ExcNodeList=\([^ ]*\).*/\1/p')
    [[ $excluded != "(null)" ]] || excluded=''
    excluded=${excluded:+$excluded,}$1
    if scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$excluded"; then
      echo "srun.sh: job $SLURM_JOB_ID runs without $1 from now on (ExcNodeList=$excluded)" >&2
    else
      echo "srun.sh: could not exclude $1 from job $SLURM_JOB_ID: scontrol update refused it" >&2
    fi
  )
}
