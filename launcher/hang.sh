# shellcheck shell=bash
# srun.sh's hang report. While the ranks train, launcher/hang_watch.py reads rank 0's step record and, once no step
# has completed for SRUNSH_HANG_TIMEOUT_S, sends srun.sh SIGUSR2. Then, and whenever the launch is stopped (SIGINT,
# SIGTERM, the batch time limit), launcher/hang_report.py asks every rank for its Python stacks and torch's flight
# recorder (SIGUSR2, answered by launcher/hang_dumps.py) before any rank is signalled to stop, and writes
# RUN_DIR/hang-report.txt. Sourced by srun.sh, whose variables and helpers (launch, launch_step) it uses.

# The launch COMMAND, watched for a hang; its status.
launch_watched() {
  HUNG='' HANG_WATCH_PID=''
  rm -rf -- "$HOST_RUN_DIR/hang" # an earlier launch's records: the ranks register afresh
  trap stop_hung_launch USR2
  if [[ $SRUNSH_HANG_TIMEOUT_S != off ]]; then
    python3 "$REPO_DIR/launcher/hang_watch.py" "$HOST_RUN_DIR" --timeout "${SRUNSH_HANG_TIMEOUT_S:-default}" \
      --notify "$$" &
    HANG_WATCH_PID=$!
  fi
  HANG_REPORT_DUE=1
  local status=0
  launch "$@" || status=$?
  HANG_REPORT_DUE=0
  [[ -z $HANG_WATCH_PID ]] || { kill "$HANG_WATCH_PID" && wait "$HANG_WATCH_PID"; } 2>/dev/null || true
  return "$status"
}

# SIGUSR2 from the hang watch: the report, then SIGTERM to every rank. srun.sh then exits 124.
# shellcheck disable=SC2329  # invoked by the trap that launch_watched sets
stop_hung_launch() {
  [[ -z ${STOPPED_BY:-}${HUNG:-} ]] || return 0
  HUNG=1
  collect_hang_report "$(cat -- "$HOST_RUN_DIR/hang/stalled.txt")"
  stop_ranks
}

# The hang report, once per launch, before any rank is signalled to stop. WHY says what stopped the launch.
collect_hang_report() {
  ((${HANG_REPORT_DUE:-0})) || return 0
  HANG_REPORT_DUE=0
  local target=(--local)
  if ((!LOCAL)); then
    target=(--step "$(launch_step)")
    [[ -n ${target[1]} ]] || return 0 # no step yet: no rank to ask
  fi
  ((!${HUNG:-0})) || target+=(--stalled) # the hang watch's: a stall, not a stop of a job that may be progressing
  python3 "$REPO_DIR/launcher/hang_report.py" "$HOST_RUN_DIR" --why "$1" --world-size "$WORLD_SIZE" \
    --nodes "$NODE_LIST" --ranks-per-node "$SRUNSH_GPUS_PER_NODE" "${target[@]}" || true
}
