# shellcheck shell=bash
# The launch's supervision in srun.sh: it runs the launch command (srun, or torchrun with --local), passes SIGINT,
# SIGTERM and SIGHUP on to every rank as SIGTERM, and names the rank that failed first from the records that each
# rank leaves (launcher/rank.sh). Sourced by srun.sh, whose variables it uses.

# The launcher's own account of the launch goes to RUN_DIR/logs/launcher.log: torchrun's log and failure report with
# --local; srun's, slurmstepd's and pyxis's lines under SLURM. Of srun's, the per-task status lines, the cancellation
# notices and pyxis's (one set a node) go there only: srun.sh reports the first failure, or the cause that pyxis or
# SLURM gave, itself. srun's other lines (a step waiting for resources, an error creating it) reach the console too.
# GNU sed -u passes each line on as it arrives (mawk, Debian's awk, holds a pipe's lines until its buffer fills).
keep_launcher_notes() {
  trap '' INT TERM
  umask 077
  if ((LOCAL)); then # torchrun's lines are the ones that are neither a rank's (labelled) nor srun.sh's
    sed -u -E -e '/^([0-9]+|srun\.sh): /!{w /dev/stderr' -e 'd}' 2>>"$1"
  else
    local only='^(srun: error: [^ ]+: tasks? [0-9,-]+: (Exited with exit code [0-9]+|Terminated|Killed)$'
    only+='|slurmstepd(-[^:]+)?: |srun: (launch/slurm: _step_signal: Terminating StepId|Job step aborted'
    only+='|forcing job termination|Force Terminated|got SIGCONT|error: (pyxis|spank)))'
    sed -u -E -e "\\#$only#{w /dev/stderr" -e 'd}' -e '/^srun: /w /dev/stderr' 2>>"$1"
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
  exec {notes}> >(keep_launcher_notes "$log" >&2)
  local notes_pid=$!
  "${session[@]}" "$@" 2>&"$notes" &
  LAUNCH_PID=$!
  exec {notes}>&-
  wait_for "$LAUNCH_PID" || status=$?
  wait "$notes_pid" || true
  return "$status"
}

# Which rank failed first, on which host, with which status, and the end of its log; or the one-line error that every
# rank found; or what stopped every rank from outside; or, when no rank ended, what srun or torchrun said. Ranks that
# were stopped (SIGINT, SIGTERM, SIGKILL) sort after one that failed.
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
    report_launcher_notes
    return 1
  fi
  read -r stopped when rank FIRST_STATUS host <<<"$line"
  if ((stopped)); then
    report_stopped_from_outside "rank $rank on $host first, with exit status $FIRST_STATUS"
  elif [[ -e $logs/rank-$rank.log ]]; then
    show_log_end "srun.sh: rank $rank on $host failed first, with exit status $FIRST_STATUS;" "$logs/rank-$rank.log"
  else
    echo "srun.sh: rank $rank on $host failed first, with exit status $FIRST_STATUS, before it wrote a log" >&2
  fi
}

# This launch's lines of launcher.log; under SLURM each once, since pyxis and slurmstepd say the same on every node.
launch_notes() {
  # shellcheck disable=SC2016  # awk's $0
  local dedupe=(awk '!seen[$0]++')
  ((!LOCAL)) || dedupe=(cat)
  tail -c "+$LAUNCHER_LOG_START" -- "$HOST_RUN_DIR/logs/launcher.log" 2>/dev/null | "${dedupe[@]}"
}

# No rank ended (none started, or none could record its end): the end of what srun or torchrun said, which holds the
# cause (a container pyxis could not create, a step SLURM refused, a SRUNSH_PYTHON without torch).
report_launcher_notes() {
  local notes said="srun said"
  notes=$(launch_notes | grep -E -v ': tasks? [0-9,-]+: Exited with exit code [0-9]+$' | tail -n 20) || true
  [[ -n $notes ]] || return 0
  ((!LOCAL)) || said="torchrun said"
  echo "srun.sh: the launch failed before any rank started; $said ($HOST_RUN_DIR/logs/launcher.log):" >&2
  printf '%s\n' "$notes" | indent
}

# Every rank that ended was stopped by a signal that srun.sh did not send (scancel, a revoked allocation, preemption,
# a time limit): say so, with what SLURM said, instead of naming a stopped rank as the failure.
report_stopped_from_outside() {
  local cancelled step what="every rank" state=''
  cancelled=$(launch_notes | grep -E '\*\*\* (STEP|JOB) [0-9.]+ ON .* CANCELLED AT' | head -n 5) || true
  step=$(sed -n -E 's/.*\*\*\* STEP ([0-9.]+) ON .*/\1/p' <<<"$cancelled" | head -n 1)
  [[ -z $step ]] || what="job step $step"
  if ((!LOCAL)); then
    state=$(scontrol show job --oneliner "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.* JobState=\([^ ]*\).*/\1/p') || true
    state="job $SLURM_JOB_ID is ${state:-no longer known to SLURM}; "
  fi
  echo "srun.sh: $what was stopped from outside srun.sh, no rank failed on its" \
    "own (${state}every rank ended by a signal, $1)${cancelled:+:}" >&2
  [[ -z $cancelled ]] || printf '%s\n' "$cancelled" | indent
}

# HEADLINE "the end of LOG:", then LOG's last 20 lines, indented, on stderr.
show_log_end() {
  echo "$1 the end of $2:" >&2
  tail -n 20 -- "$2" | indent
}

# Lines of a report below its headline.
indent() {
  sed 's/^/    /' >&2
}
