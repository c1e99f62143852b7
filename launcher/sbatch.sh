# shellcheck shell=bash
# Batch jobs of srun.sh: `srun.sh --sbatch SBATCH_OPTION... -- LAUNCH...` submits, and the job's own
# `srun.sh --batch-job LAUNCH...` saves before the time limit and requeues itself. Sourced by srun.sh, whose variables
# and helpers (die, parse_args, launch_step) it uses.

# The job's script: sbatch copies it into SLURM's spool, so it names this checkout's srun.sh by its full path.
batch_script() {
  printf '#!/usr/bin/env bash\n# srun.sh --sbatch: one run that saves before its time limit and requeues itself.\n'
  printf 'exec %q --batch-job%s\n' "$REPO_DIR/srun.sh" "$(printf ' %q' "$@")"
}

submit_batch() {
  local -a launch=()
  while (($#)) && [[ $1 != -- ]]; do
    SBATCH_ARGS+=("$1")
    shift
  done
  (($#)) || die "--sbatch takes sbatch options, then -- and the launch:" "./srun.sh --sbatch -N 2 -t 4:00:00 -- RECIPE.py"
  shift
  # shellcheck disable=SC2034  # read by parse_args in srun.sh (launcher/preflight.py: batch knobs, time limit)
  SUBMITTING=1
  parse_args "$@"
  local arg
  for arg in "$@"; do
    [[ $arg == --dry-run ]] || launch+=("$arg")
  done
  local -a submit=(sbatch --requeue --open-mode=append "--signal=B:USR1@$SRUNSH_SAVE_LEAD_S")
  [[ " ${SBATCH_ARGS[*]} " == *" -o"* || " ${SBATCH_ARGS[*]} " == *" --output"* ]] ||
    submit+=("--output=$RUN_ROOT/slurm-%j.out")
  submit+=("${SBATCH_ARGS[@]}")
  local script
  script=$(batch_script "${launch[@]}")
  if ((DRY_RUN)); then
    echo "# srun.sh --sbatch --dry-run: nothing was submitted. The submission, with the job script on its stdin:"
    say_environment_knobs "# "
    quoted "${submit[@]}"
    printf '%s\n' "$script"
    exit 0
  fi
  command -v sbatch >/dev/null || die "sbatch is not found on this host:" "submit where SLURM's client commands are"
  local out job
  out=$("${submit[@]}" --test-only 2>&1 <<<"$script") ||
    die "sbatch refused the job: $(grep -m 1 -i 'error\|unrecognized\|invalid' <<<"$out" || head -n 1 <<<"$out")"
  say_environment_knobs "# srun.sh: " >&2
  (umask 077 && mkdir -p -- "$RUN_ROOT")
  job=$("${submit[@]}" --parsable <<<"$script")
  job=${job%%;*}
  echo "srun.sh: submitted batch job $job: run ${SRUNSH_RUN_ID:-$job}, outputs in $RUN_ROOT/${SRUNSH_RUN_ID:-$job}/," \
    "rank logs in its logs/, the job's log in $RUN_ROOT/slurm-$job.out"
  exit 0
}

# SLURM signals USR1 SRUNSH_SAVE_LEAD_S before the time limit (sbatch --signal=B:USR1@SRUNSH_SAVE_LEAD_S), or up to
# a minute earlier (slurmctld looks at time limits every 30 s): it may come before training starts.
trap_time_limit() {
  TRAINING_STARTED=0
  trap save_before_time_limit USR1
}

# Right before the training launch: false once the time limit is near (USR1 came during the health check or before
# it), and no training starts; from here on USR1 stops the ranks.
time_left_to_train() {
  TRAINING_STARTED=1 # first, so that a USR1 from now on is either seen below or stops the launch
  ((!TIME_LIMIT_REACHED)) || TRAINING_STARTED=0
  ((TRAINING_STARTED))
}

# The batch job is SRUNSH_SAVE_LEAD_S from its time limit (sbatch --signal=B:USR1): every rank gets SIGTERM, on which
# Megatron Bridge saves a checkpoint and stops; the job then requeues itself. Before training, the health check
# runs to its verdict (a stopped one would judge no node) and the job then requeues itself untrained.
# shellcheck disable=SC2329  # invoked by the trap that trap_time_limit sets
save_before_time_limit() {
  TIME_LIMIT_REACHED=1
  if ((!TRAINING_STARTED)); then
    echo "srun.sh: job $SLURM_JOB_ID reaches its time limit in ${SRUNSH_SAVE_LEAD_S}s before training started:" \
      "it starts no training and requeues itself" >&2
    return 0
  fi
  echo "srun.sh: job $SLURM_JOB_ID reaches its time limit in ${SRUNSH_SAVE_LEAD_S}s:" \
    "SIGTERM to every rank to save and stop" >&2
  collect_hang_report "the job's time limit is ${SRUNSH_SAVE_LEAD_S}s away" # launcher/hang.sh
  stop_ranks --to-save # launcher/supervise.sh
}

# After the launch of a --sbatch job: requeue it when it stopped for its time limit, or failed with retries left;
# it then resumes run RUN_ID from its latest checkpoint. SIGTERM to the job (scancel, preemption) requeues nothing:
# SLURM requeues a preempted job itself. REASON, if given, says how it failed. Returns 0 once it is requeued.
requeue_batch_job() {
  local status=$1 history=$HOST_RUN_DIR/logs/requeues.log reason failures
  if ((TIME_LIMIT_REACHED && TRAINING_STARTED)); then
    reason="saved before the time limit (exit status $status)"
  elif ((TIME_LIMIT_REACHED)); then
    reason=${2:-"its time limit came before training started"}
  elif ((status)) && [[ -z $STOPPED_BY ]]; then
    failures=$(grep -c ': failed ' "$history" 2>/dev/null) || true
    if ((${failures:-0} >= SRUNSH_MAX_RETRIES)); then
      echo "srun.sh: job $SLURM_JOB_ID failed, and is not requeued: it was requeued after ${failures:-0}" \
        "failure(s) already (SRUNSH_MAX_RETRIES=$SRUNSH_MAX_RETRIES)" >&2
      return "$status"
    fi
    reason=${2:-"failed with exit status $status"}
  else
    return "$status"
  fi
  printf '%s job %s restart %s: %s\n' "$(date +%FT%T)" "$SLURM_JOB_ID" "${SLURM_RESTART_COUNT:-0}" "$reason" >>"$history"
  echo "srun.sh: $reason: requeueing job $SLURM_JOB_ID, which resumes run $SRUNSH_RUN_ID from its latest checkpoint" >&2
  remove_launch_container # launcher/container.sh: while the job's allocation is still there
  scontrol requeue "$SLURM_JOB_ID" || return "$status"
}
