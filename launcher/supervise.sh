# shellcheck shell=bash
# The launch's supervision in srun.sh: it runs the launch command (srun, or torchrun with --local), passes SIGINT,
# SIGTERM and SIGHUP on to every rank as SIGTERM, and names the rank that failed first from the records that each
# rank leaves (launcher/rank.sh). Sourced by srun.sh, whose variables it uses.

# The launcher's own account of the ranks' ends goes to RUN_DIR/logs/launcher.log (srun's per-task status lines,
# torchrun's log and failure report): srun.sh reports the first failure itself. Everything else reaches the console.
# GNU sed -u passes each line on as it arrives (mawk, Debian's awk, holds a pipe's lines until its buffer fills).
keep_launcher_notes() {
  trap '' INT TERM
  if ((LOCAL)); then # torchrun's lines are the ones that are neither a rank's (labelled) nor srun.sh's
    sed -u -E -e '/^([0-9]+|srun\.sh): /!{w /dev/stderr' -e 'd}' 2>>"$1"
  else
    local status='^(srun: error: [^ ]+: tasks? [0-9,-]+: (Exited with exit code [0-9]+|Terminated|Killed)'
    status+='|slurmstepd(-[^:]+)?: error: \*\*\* STEP [0-9.]+ ON .* CANCELLED AT .*)$'
    sed -u -E -e "/$status/{w /dev/stderr" -e 'd}' 2>>"$1"
  fi
}

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

# SIGTERM to every rank, SIGKILL to what is left after the grace period (the cluster's KillWait; torchrun's 30 s).
stop_ranks() {
  local step
  ((LOCAL)) || step=$(launch_step)
  if [[ -z ${step:-} ]]; then
    # torchrun, or srun before its step exists (it then cancels its request)
    [[ -z $LAUNCH_PID ]] || kill -TERM "$LAUNCH_PID" 2>/dev/null || true
    return 0 # a bare return in a trap would return the status of the wait it interrupted
  fi
  scancel --signal=TERM "$step" || true
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
    awk -v name="srunsh-$RUN_ID" '$2 == name { print $1; exit }' || true
}

trap_stop_signals() {
  STOPPED_BY='' LAUNCH_PID=''
  local signal
  for signal in INT TERM HUP; do
    # shellcheck disable=SC2064  # the signal's name is fixed now, on purpose
    trap "stop_launch $signal" "$signal"
  done
  ((!BATCH_JOB)) || trap_time_limit
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
  local notes session=() status=0
  ((!LOCAL)) || session=(setsid)
  exec {notes}> >(keep_launcher_notes "$HOST_RUN_DIR/logs/launcher.log" >&2)
  local notes_pid=$!
  "${session[@]}" "$@" 2>&"$notes" &
  LAUNCH_PID=$!
  exec {notes}>&-
  wait_for "$LAUNCH_PID" || status=$?
  wait "$notes_pid" || true
  return "$status"
}

# Which rank failed first, on which host, with which status, and the end of its log; or the one-line config error
# that every rank found. Ranks that the launcher stopped (SIGINT, SIGTERM, SIGKILL) sort after one that failed.
report_failure() {
  local logs=$HOST_RUN_DIR/logs file status when host stopped rank line
  if [[ -s $logs/usage-error ]]; then
    cat -- "$logs/usage-error" >&2
    FIRST_STATUS=2
    return 0
  fi
  line=$(for file in "$logs"/rank-*.status; do
    [[ -e $file ]] || continue
    read -r status when host <"$file"
    ((status)) || continue
    case $status in
      130 | 137 | 143) stopped=1 ;;
      *) stopped=0 ;;
    esac
    rank=${file##*/rank-}
    echo "$stopped $when ${rank%.status} $status $host"
  done | sort -k1,1n -k2,2g | head -n 1)
  if [[ -z $line ]]; then
    [[ -s $logs/launcher.log ]] || return 1
    show_log_end "srun.sh: the launch failed before any rank ended;" "$logs/launcher.log"
    return 1
  fi
  read -r stopped when rank FIRST_STATUS host <<<"$line"
  show_log_end "srun.sh: rank $rank on $host failed first, with exit status $FIRST_STATUS;" "$logs/rank-$rank.log"
}

# HEADLINE "the end of LOG:", then LOG's last 20 lines, indented, on stderr.
show_log_end() {
  echo "$1 the end of $2:" >&2
  tail -n 20 -- "$2" | sed 's/^/    /' >&2
}

