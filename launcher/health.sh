# shellcheck shell=bash disable=SC2034  # what it sets (HEALTH_CMD) srun.sh reads
# srun.sh's health check (`--health`, or SRUNSH_HEALTH=1 before a launch or a batch job): every rank runs
# launcher/health.py in the launch's own srun step (geometry, container, environment), and launcher/health_report.py
# on this host enforces each part's deadline and prints the table. A batch job whose check fails requeues itself
# without the nodes that failed (health/failed-nodes: the condemned ones; a suspect node is named, not excluded, and
# passes; launcher/exclude_nodes.py). Sourced by srun.sh, whose variables and helpers (launch, requeue_batch_job) it
# uses.

# HEALTH_CMD: the launch command with launcher/health.py as every rank's program.
health_check_command() {
  launch_command "$CODE_DIR/srun.sh" --rank-exec "$SRUNSH_PYTHON" "$CODE_DIR/launcher/health.py"
  HEALTH_CMD=("${LAUNCH_CMD[@]}")
}

# Runs the check; returns only when every node passed and a launch follows. Otherwise exits: 0 or 1 with --health,
# 1 after a failed check (a batch job first requeues itself without the nodes that failed).
check_health() {
  local status=0
  echo "# srun.sh: health check of ${#HOSTS[@]} node(s) x $SRUNSH_GPUS_PER_NODE rank(s), each part within" \
    "${SRUNSH_HEALTH_TIMEOUT_S}s (SRUNSH_HEALTH_TIMEOUT_S)" >&2
  rm -f -- "$HOST_RUN_DIR/health.json"
  launch python3 "$REPO_DIR/launcher/health_report.py" "$HOST_RUN_DIR" --timeout "$SRUNSH_HEALTH_TIMEOUT_S" \
    --nodes "$NODE_LIST" --ranks-per-node "$SRUNSH_GPUS_PER_NODE" -- "${HEALTH_CMD[@]}" || status=$?
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
  # The requeue's SIGTERM reaches this script and its children: ignored from here on, since nothing is left to stop,
  # and the stop's trap would spend the cluster's KillWait before the nodes are excluded (the test cluster's 5 s did).
  trap '' TERM
  requeue_batch_job "$status" "failed the health check${failed:+ on $failed}" || exit $?
  [[ -z $failed ]] || python3 "$REPO_DIR/launcher/exclude_nodes.py" "$SLURM_JOB_ID" "$failed" || true
  exit "$status"
}
