# shellcheck shell=bash
# The launch's supervision in srun.sh: it runs the launch command (srun, or torchrun with --local), passes SIGINT,
# SIGTERM and SIGHUP on to every rank as SIGTERM, and reports the first failure. Sourced by srun.sh.

# SIGINT, SIGTERM or SIGHUP to srun.sh: the hang report, then every rank is stopped. Runs as a trap: srun.sh then
# exits 128+N.
# shellcheck disable=SC2329  # invoked by the traps that trap_stop_signals sets
stop_launch() {
  [[ -z ${STOPPED_BY:-} ]] || return 0
  STOPPED_BY=$1
  echo "srun.sh: got SIG$1; sending SIGTERM to every rank" >&2
  collect_hang_report "srun.sh got SIG$1" # launcher/hang.sh: before any rank is signalled
  stop_ranks
}

# SIGTERM to every rank, SIGKILL to what is left after the grace period (the cluster's KillWait; torchrun's 30 s);
# --to-save: no SIGKILL, the ranks save a checkpoint before the time limit (SLURM kills what is left at the limit).
stop_ranks() {
  local step
  ((LOCAL)) || step=$(launch_step)
  if [[ -z ${step:-} ]]; then
    # torchrun, or srun before its step exists (it then cancels its request)
    [[ -z $LAUNCH_PID ]] || kill -TERM "$LAUNCH_PID" 2>/dev/null || true
    return 0 # a bare return in a trap would return the status of the wait it interrupted
  fi
  scancel --signal=TERM "$step" || true
  [[ ${1:-} != --to-save ]] || return 0
  local grace
  grace=$(scontrol show config 2>/dev/null | awk '$1 == "KillWait" { print $3 + 0 }') || true
  local deadline=$((SECONDS + ${grace:-30}))
  while kill -0 "$LAUNCH_PID" 2>/dev/null && ((SECONDS < deadline)); do
    sleep 0.2
  done
  scancel "$step" 2>/dev/null || true
}

# JOB.STEP of this launch's srun step; empty before it exists.
# shellcheck disable=SC2329  # invoked by the functions the traps run
launch_step() {
  squeue --noheader --steps --jobs="$SLURM_JOB_ID" --format='%i %j' 2>/dev/null |
    awk -v name="srunsh-$SRUNSH_RUN_ID" '$2 == name { print $1; exit }' || true
}

trap_stop_signals() {
  STOPPED_BY='' LAUNCH_PID=''
  local signal
  for signal in INT TERM HUP; do
    # shellcheck disable=SC2064  # the signal's name is fixed now, on purpose
    trap "stop_launch $signal" "$signal"
  done
  trap remove_launch_container EXIT # launcher/container.sh
}

# A wait that outlives the signals srun.sh traps: returns the child's own status once it has ended.
wait_for() {
  local status
  while :; do
    status=0
    wait "$1" || status=$?
    kill -0 "$1" 2>/dev/null || return "$status"
  done
}

# Runs the launch COMMAND to its end. torchrun gets a session of its own, so that a terminal's Ctrl-C reaches the
# ranks once, as srun.sh's SIGTERM.
launch() {
  local notes session=() status=0 log=$HOST_RUN_DIR/logs/launcher.log
  ((!LOCAL)) || session=(setsid)
  LAUNCHER_LOG_START=$(($(stat -c %s -- "$log" 2>/dev/null || echo 0) + 1)) # this launch's lines start here
  # srun's or torchrun's lines: to the console, the log, or both (launcher/launcher_notes.py); they outlive a SIGTERM.
  exec {notes}> >(trap '' INT TERM && exec python3 "$REPO_DIR/launcher/launcher_notes.py" "$log" "$LOCAL" >&2)
  local notes_pid=$!
  "${session[@]}" "$@" 2>&"$notes" &
  LAUNCH_PID=$!
  exec {notes}>&-
  wait_for "$LAUNCH_PID" || status=$?
  wait "$notes_pid" || true
  return "$status"
}

# The report of a launch that ended badly (launcher/first_failure.py: the rank that failed first and the end of its
# log, the error every rank found, a stop from outside, what srun or torchrun said). FIRST_STATUS: the status srun.sh
# exits with; it fails when no rank ended.
report_failure() {
  FIRST_STATUS=$(python3 "$REPO_DIR/launcher/first_failure.py" "$HOST_RUN_DIR" --log-start "$LAUNCHER_LOG_START" \
    --local "$LOCAL") || true
  [[ -n $FIRST_STATUS ]]
}
