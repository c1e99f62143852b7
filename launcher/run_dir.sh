# shellcheck shell=bash disable=SC2034  # what it sets (RESUMING, RUN_BASE, NEW_RUN, ...) srun.sh reads
# The run directory of a launch, RUN_ROOT/RUN_ID, taken before anything starts. A new run takes its id by creating its
# directory, which is atomic (on shared file systems too): launches started together, in one allocation or in
# several, get ids of their own (the second in one second gets -2, the third -3). A launch holds its run's lock while
# it runs, so a second launch of a RUN_ID that is still running is refused instead of resuming into the live run.
# Sourced by srun.sh, whose variables and helpers (die, q) it uses.

# SRUNSH_RUN_ID, unless the user named a run: <job id>-<date>-<time>, or local-<date>-<time>-<pid> with --local.
name_run() {
  NEW_RUN=0 RUN_TAKEN=0
  if [[ -z $SRUNSH_RUN_ID ]]; then
    NEW_RUN=1
    local stamp
    stamp=$(date +%Y%m%d-%H%M%S)
    SRUNSH_RUN_ID=${SLURM_JOB_ID:-JOBID}-$stamp
    ((!LOCAL)) || SRUNSH_RUN_ID=local-$stamp-$$
  fi
  RUN_BASE=$SRUNSH_RUN_ID
}

# The run's rendezvous port: 20000-32767, below Linux's ephemeral range (32768+), derived from RUN_DIR, so that two
# runs on one node differ; launches that took their ids in the same second differ by RUN_TAKEN.
run_port() {
  local checksum
  checksum=$(cksum <<<"$RUN_ROOT/$RUN_BASE")
  echo $((20000 + (${checksum%% *} + RUN_TAKEN) % 12768))
}

claim_run_dir() {
  local error
  error=$(umask 077 && mkdir -p -- "$RUN_ROOT" 2>&1) ||
    die "cannot create the run folder $(q "$RUN_ROOT") (${error##*: }):" \
      "set SRUNSH_OUTPUT_ROOT to a folder you can write"
  RUN_TAKEN=0 RESUMING=0
  if ((NEW_RUN)); then
    until error=$(umask 077 && mkdir -- "$RUN_ROOT/$SRUNSH_RUN_ID" 2>&1); do
      [[ -e $RUN_ROOT/$SRUNSH_RUN_ID ]] ||
        die "cannot create the run folder $(q "$RUN_ROOT/$SRUNSH_RUN_ID") (${error##*: }):" \
          "set SRUNSH_OUTPUT_ROOT to a folder you can write"
      RUN_TAKEN=$((RUN_TAKEN + 1))
      SRUNSH_RUN_ID=$RUN_BASE-$((RUN_TAKEN + 1))
    done
  else
    [[ ! -d $RUN_ROOT/$SRUNSH_RUN_ID ]] || RESUMING=1
  fi
  (umask 077 && mkdir -p -- "$RUN_ROOT/$SRUNSH_RUN_ID/logs")
  lock_run "$RUN_ROOT/$SRUNSH_RUN_ID/.lock"
}

# Holds the lock (flock) on FILE until srun.sh and the processes it starts have ended, and notes who holds it.
lock_run() {
  command -v flock >/dev/null || return 0
  local file=$1 old_umask status=0
  old_umask=$(umask)
  umask 077
  exec {RUN_LOCK}>>"$file"
  umask "$old_umask"
  flock --nonblock --conflict-exit-code 75 "$RUN_LOCK" 2>/dev/null || status=$?
  if ((status == 75)); then
    die "run $SRUNSH_RUN_ID is still running ($(<"$file")):" \
      "wait for it to end, or leave SRUNSH_RUN_ID unset for a new run"
  elif ((status)); then
    echo "srun.sh: $file cannot be locked on this file system (flock exit status $status), so a second launch" \
      "of run $SRUNSH_RUN_ID is not refused while this one runs" >&2
  fi
  printf 'srun.sh pid %s on %s%s\n' "$$" "$(uname -n)" "${SLURM_JOB_ID:+, job $SLURM_JOB_ID}" >"$file"
}
