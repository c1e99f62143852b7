# shellcheck shell=bash disable=SC2034  # what it sets (SRUNSH_CONTAINER_NAME, CONTAINER_START) srun.sh reads
# How srun.sh's container steps start (launcher/container.py says which path pyxis takes). A launch of more than one
# container step (SRUNSH_HEALTH=1: the health check, then training) gives them one pyxis container of its own, so that each
# node unpacks the image once, not once a step; it is removed from every node when the launch ends, however it ends.
# Sourced by srun.sh, whose variables (SRUNSH_SQSH, SRUNSH_RUN_ID, HOSTS, SRUNSH_HEALTH, SRUNSH_CONTAINER_NAME, ...) it uses.

# Before launch_command: the launch's shared container, if any, becomes the steps' --container-name, and
# CONTAINER_START the header's line about it.
plan_container_start() {
  LAUNCH_CONTAINER='' CONTAINER_START=''
  ((USE_CONTAINER && !LOCAL)) || return 0
  local steps=1 plan
  ((!SRUNSH_HEALTH || HEALTH_ONLY)) || steps=2
  plan=$(python3 "$REPO_DIR/launcher/container.py" --image "$SRUNSH_SQSH" --run-id "$SRUNSH_RUN_ID" --steps "$steps" \
    --launch "${SLURM_JOB_ID:-}.${SLURM_RESTART_COUNT:-0}.$$.$EPOCHREALTIME" --name "$SRUNSH_CONTAINER_NAME")
  LAUNCH_CONTAINER=${plan%%$'\n'*}
  CONTAINER_START=${plan#*$'\n'}
  [[ -z $LAUNCH_CONTAINER ]] || SRUNSH_CONTAINER_NAME=$LAUNCH_CONTAINER
}

# The launch's container off every node: one task a node, outside any container, runs enroot as pyxis does (pyxis
# keeps a named container as pyxis_NAME, or pyxis_JOBID_NAME with container_scope=job). Once per launch; runs on
# every way srun.sh ends (an EXIT trap) and before a batch job requeues itself, while the allocation still exists.
# Removing an unpacked image takes as long as pyxis's own removal of an unnamed one (minutes for 6 GB on a slow disk).
remove_launch_container() {
  [[ -n ${LAUNCH_CONTAINER:-} ]] || return 0
  local name=$LAUNCH_CONTAINER status=0
  LAUNCH_CONTAINER=''
  # shellcheck disable=SC2016  # the node's shell expands these
  local script='for c in "pyxis_$1" "pyxis_$2_$1"; do
      if enroot list | grep -Fqx -- "$c"; then enroot remove -f -- "$c" >/dev/null && echo "removed $c"; fi
    done'
  timeout --kill-after=5 600 srun --nodes="${#HOSTS[@]}" --ntasks="${#HOSTS[@]}" --ntasks-per-node=1 --overlap \
    --mpi=none --job-name="srunsh-$SRUNSH_RUN_ID-remove" bash -c "$script" bash "$name" "$SLURM_JOB_ID" \
    >>"$HOST_RUN_DIR/logs/launcher.log" 2>&1 </dev/null || status=$?
  if ((status)); then
    echo "srun.sh: could not remove container $name from every node (status $status, see" \
      "$HOST_RUN_DIR/logs/launcher.log): remove it there with enroot remove -f pyxis_$name" >&2
  fi
  return 0
}
