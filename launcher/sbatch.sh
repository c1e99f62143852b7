# shellcheck shell=bash
# Batch jobs of srun.sh: `srun.sh --sbatch SBATCH_OPTION... -- LAUNCH...` submits, and the job's own
# `srun.sh --batch-job LAUNCH...` saves before the time limit and requeues itself. Sourced by srun.sh, whose variables
# and helpers (die, parse_args, validate, launch_step) it uses.

# Seconds of a SLURM time limit (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S); nothing for UNLIMITED or a form that sbatch
# refuses by itself.
time_limit_seconds() {
  [[ $1 =~ ^(([0-9]+)-)?([0-9]+)(:([0-9]+))?(:([0-9]+))?$ ]] || return 0
  local days=${BASH_REMATCH[2]:-0} first=${BASH_REMATCH[3]} second=${BASH_REMATCH[5]:-0} third=${BASH_REMATCH[7]:-0}
  if [[ -n ${BASH_REMATCH[1]} ]]; then # D-H[:M[:S]]
    echo $((((10#$days * 24 + 10#$first) * 60 + 10#$second) * 60 + 10#$third))
  elif [[ -n ${BASH_REMATCH[6]} ]]; then # H:M:S
    echo $(((10#$first * 60 + 10#$second) * 60 + 10#$third))
  else # M[:S]
    echo $((10#$first * 60 + 10#$second))
  fi
}

# The time limit among sbatch options (the last one wins, as in sbatch), else $SBATCH_TIMELIMIT.
sbatch_time_limit() {
  local value=${SBATCH_TIMELIMIT:-}
  while (($#)); do
    case $1 in
      -t | --time) value=${2:-} && shift ;;
      --time=*) value=${1#--time=} ;;
      -t?*) value=${1#-t} ;;
    esac
    shift
  done
  printf '%s\n' "$value"
}

# The job's script: sbatch copies it into SLURM's spool, so it names this checkout's srun.sh by its full path.
batch_script() {
  printf '#!/usr/bin/env bash\n# srun.sh --sbatch: one run that saves before its time limit and requeues itself.\n'
  printf 'exec %q --batch-job' "$REPO_DIR/srun.sh"
  printf ' %q' "$@"
  printf '\n'
}

submit_batch() {
  local -a sbatch_args=() launch=()
  while (($#)) && [[ $1 != -- ]]; do
    sbatch_args+=("$1")
    shift
  done
  (($#)) || die "--sbatch takes sbatch options, then -- and the launch:" "./srun.sh --sbatch -N 2 -t 4:00:00 -- RECIPE.py"
  shift
  # shellcheck disable=SC2034  # read by validate() in srun.sh
  SUBMITTING=1
  parse_args "$@"
  local arg
  for arg in "$@"; do
    [[ $arg == --dry-run ]] || launch+=("$arg")
  done
  ((!LOCAL)) || die "--local runs without SLURM, so it cannot be a batch job: drop --local or --sbatch"
  is_positive_int "$SRUNSH_SAVE_LEAD_S" ||
    die "SRUNSH_SAVE_LEAD_S=$(q "$SRUNSH_SAVE_LEAD_S") is not a number of seconds: e.g. SRUNSH_SAVE_LEAD_S=300"
  [[ $SRUNSH_MAX_RETRIES =~ ^[0-9]+$ ]] ||
    die "SRUNSH_MAX_RETRIES=$(q "$SRUNSH_MAX_RETRIES") is not a count: e.g. SRUNSH_MAX_RETRIES=2"
  validate
  local limit seconds
  limit=$(sbatch_time_limit "${sbatch_args[@]}")
  seconds=$(time_limit_seconds "$limit")
  if [[ -n $seconds ]] && ((seconds <= SRUNSH_SAVE_LEAD_S)); then
    die "time limit $limit ($seconds s) leaves no time before the save" \
      "SRUNSH_SAVE_LEAD_S=$SRUNSH_SAVE_LEAD_S s ahead of it:" \
      "give a longer --time or a smaller SRUNSH_SAVE_LEAD_S"
  fi
  local -a submit=(sbatch --requeue --open-mode=append "--signal=B:USR1@$SRUNSH_SAVE_LEAD_S")
  [[ " ${sbatch_args[*]} " == *" -o"* || " ${sbatch_args[*]} " == *" --output"* ]] ||
    submit+=("--output=$RUN_ROOT/slurm-%j.out")
  submit+=("${sbatch_args[@]}")
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
  local step
  step=$(launch_step)
  if [[ -n $step ]]; then
    scancel --signal=TERM "$step" || true
  elif [[ -n $LAUNCH_PID ]]; then # srun before its step is listed: it cancels the request or passes SIGTERM on
    kill -TERM "$LAUNCH_PID" 2>/dev/null || true
  fi
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
