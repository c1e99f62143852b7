# shellcheck shell=bash disable=SC2034  # what validate sets (CODE_DIR, RUN_ROOT, ...) srun.sh reads
# srun.sh's checks on the launching host, before anything starts: the recipe, the knobs, the allocation (GPUs, CPUs,
# a homogeneous job) and the container mounts. Each problem is one line from die(), exit 2. Sourced by srun.sh.

# The knobs the environment set, for the launch's first line (a knob inherited from the host steers every launch
# from it). A name with srun.sh's prefix that is no knob is a typo, refused; a knob's name from before it had the
# prefix is not read, and the launch says so, with the new name.
environment_knobs() {
  local -a knobs given=() ignored=()
  mapfile -t knobs < <(sed -n '/^# ---- Knobs/,/^# ---- End of knobs/s/^\([A-Z][A-Z0-9_]*\)=.*/\1/p' "$REPO_DIR/srun.sh")
  local name
  for name in "${ENVIRONMENT[@]}"; do
    if [[ " ${knobs[*]} " == *" $name "* ]]; then
      given+=("$name=$(q "${!name}")")
    elif [[ $name == SRUNSH_* ]]; then
      die "$name, set in the environment, is no knob of srun.sh: unset it or fix its name (./srun.sh --help)"
    elif [[ " ${knobs[*]} " == *" SRUNSH_$name "* ]]; then
      ignored+=("$name (now SRUNSH_$name)")
    fi
  done
  ENV_KNOBS=${given[*]} ENV_IGNORED=${ignored[*]}
}

# The line that names the knobs from the environment, after PREFIX; and, on stderr, the old names it did not read.
say_environment_knobs() {
  [[ -z $ENV_KNOBS ]] || printf '%sknobs from the environment: %s\n' "$1" "$ENV_KNOBS"
  [[ -z $ENV_IGNORED ]] || echo "srun.sh: not read, since srun.sh's knobs have the SRUNSH_ prefix: $ENV_IGNORED" >&2
}

# GPUs a process here sees: CUDA_VISIBLE_DEVICES when set (even empty), else the NVIDIA device files.
visible_gpus() {
  local -a ids=()
  if [[ -v CUDA_VISIBLE_DEVICES ]]; then
    IFS=, read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
    local id count=0
    for id in "${ids[@]}"; do
      [[ -n $id ]] && count=$((count + 1))
    done
    echo "$count"
  else
    { compgen -G '/dev/nvidia[0-9]*' || true; } | wc -l
  fi
}

# The fewest CPUs any node of the job has, from SLURM_JOB_CPUS_PER_NODE ("96(x2),48").
min_cpus_per_node() {
  local -a entries
  local entry cpus min=''
  IFS=, read -ra entries <<<"$1"
  for entry in "${entries[@]}"; do
    cpus=${entry%%(*}
    if [[ -z $min ]] || ((cpus < min)); then
      min=$cpus
    fi
  done
  printf '%s\n' "$min"
}

# SRUNSH_MOUNT split into its entries: MOUNT_SRCS (absolute; or pyxis's tmpfs and umount), MOUNT_DSTS, MOUNT_FLAGS, and
# CONTAINER_MOUNTS, SRUNSH_MOUNT as pyxis gets it. pyxis takes a source that starts with neither / nor ./ for neither a
# path nor anything else, and refuses the whole step on every node, so relative sources are made absolute here.
parse_mounts() {
  MOUNT_SRCS=() MOUNT_DSTS=() MOUNT_FLAGS=()
  local -a entries given=()
  local entry src dst flags rest
  IFS=, read -ra entries <<<"$SRUNSH_MOUNT"
  for entry in "${entries[@]}"; do
    IFS=: read -r src dst flags rest <<<"$entry"
    if [[ -z $src || $dst != /* || -n $rest ]]; then
      die "SRUNSH_MOUNT entry $(q "$entry") is not SRC:DST[:FLAGS] with an absolute DST:" \
        "fix SRUNSH_MOUNT, e.g. SRUNSH_MOUNT=$(q "$REPO_DIR:/workspace/megatron")"
    fi
    if [[ $src != tmpfs && $src != umount ]]; then
      [[ -e $src ]] ||
        die "SRUNSH_MOUNT source $(q "$src") does not exist on this host: create it or drop it from SRUNSH_MOUNT"
      src=$(realpath -s -- "$src")
    fi
    MOUNT_SRCS+=("$src") MOUNT_DSTS+=("$dst") MOUNT_FLAGS+=("$flags")
    given+=("$src:$dst${flags:+:$flags}")
  done
  local IFS=,
  CONTAINER_MOUNTS=${given[*]}
}

# Index of the SRUNSH_MOUNT entry whose source holds PATH, the longest such; fails when none does.
mount_index() {
  local path=$1 best=-1 best_len=-1 i src
  for i in "${!MOUNT_SRCS[@]}"; do
    [[ ${MOUNT_SRCS[i]} == tmpfs || ${MOUNT_SRCS[i]} == umount ]] && continue
    src=$(realpath -m -- "${MOUNT_SRCS[i]}")
    if [[ ($path == "$src" || $path == "$src"/* || $src == /) && ${#src} -gt $best_len ]]; then
      best=$i best_len=${#src}
    fi
  done
  ((best >= 0)) && printf '%s\n' "$best"
}

# PATH's name inside the container, or fails when no SRUNSH_MOUNT entry holds it.
container_path() {
  local path=$1 i src dst
  i=$(mount_index "$path") || return 1
  src=$(realpath -m -- "${MOUNT_SRCS[i]}") dst=${MOUNT_DSTS[i]}
  if [[ $src == / ]]; then
    printf '%s\n' "${dst%/}$path"
  else
    printf '%s\n' "$dst${path#"$src"}"
  fi
}

# PATH's name in the container, or a one-line error naming WHAT could not be seen there.
in_container() {
  local what=$1 path=$2
  container_path "$path" ||
    die "$what $(q "$path") is outside every SRUNSH_MOUNT source, so the ranks cannot see it:" \
      "add its directory to SRUNSH_MOUNT (now $(q "$SRUNSH_MOUNT"))"
}

# The ranks write logs, checkpoints and traces under SRUNSH_OUTPUT_ROOT: its mount must not be read-only (pyxis's flags
# are joined by '+', as in ro+rprivate).
validate_output_mount() {
  local i flag
  local -a flags
  i=$(mount_index "$RUN_ROOT")
  IFS=+ read -ra flags <<<"${MOUNT_FLAGS[i]}"
  for flag in "${flags[@]}"; do
    [[ $flag != ro ]] ||
      die "SRUNSH_OUTPUT_ROOT $(q "$RUN_ROOT") is in SRUNSH_MOUNT entry" \
        "$(q "${MOUNT_SRCS[i]}:${MOUNT_DSTS[i]}:${MOUNT_FLAGS[i]}")," \
        "which the ranks see read-only: drop :ro from it, or set SRUNSH_OUTPUT_ROOT to a folder of a writable mount"
  done
}

# A squashfs file, named by its absolute path: pyxis takes a name that starts with neither / nor ./ for an image to
# pull from a registry.
validate_image() {
  [[ -f $SRUNSH_SQSH ]] ||
    die "image SRUNSH_SQSH=$(q "$SRUNSH_SQSH") does not exist:" "build it with 'make build' or point SRUNSH_SQSH at one"
  local magic
  magic=$(LC_ALL=C head -c 4 -- "$SRUNSH_SQSH" 2>/dev/null | tr -d '\0') || true
  [[ $magic == hsqs ]] ||
    die "image SRUNSH_SQSH=$(q "$SRUNSH_SQSH") is not a squashfs file:" \
      "build one with 'make build' or point SRUNSH_SQSH at the .sqsh it wrote"
  SRUNSH_SQSH=$(realpath -s -- "$SRUNSH_SQSH")
}

validate_local_gpus() {
  local visible
  visible=$(visible_gpus)
  ((visible > 0)) || [[ -n $SRUNSH_GPUS_PER_NODE ]] ||
    die "--local found no GPU (CUDA_VISIBLE_DEVICES, /dev/nvidia*):" "run it on a GPU host or set CUDA_VISIBLE_DEVICES"
  SRUNSH_GPUS_PER_NODE=${SRUNSH_GPUS_PER_NODE:-$visible}
  if is_positive_int "$SRUNSH_GPUS_PER_NODE" && ((SRUNSH_GPUS_PER_NODE > visible)); then
    die "SRUNSH_GPUS_PER_NODE=$SRUNSH_GPUS_PER_NODE but this host shows $visible GPU(s):" \
      "lower SRUNSH_GPUS_PER_NODE or widen CUDA_VISIBLE_DEVICES"
  fi
}

validate_slurm_allocation() {
  if [[ -z ${SLURM_JOB_ID:-} ]]; then
    ((DRY_RUN)) || die "not inside a SLURM allocation: run under salloc/sbatch, or use --local / --dry-run"
    SRUNSH_GPUS_PER_NODE=${SRUNSH_GPUS_PER_NODE:-8}
    return 0
  fi
  [[ -z ${SLURM_HET_SIZE:-} ]] ||
    die "job $SLURM_JOB_ID is heterogeneous ($SLURM_HET_SIZE components), which srun.sh cannot place ranks in:" \
      "allocate one set of identical nodes"
  local allocated=${SLURM_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-}} # "4" or "h100:4"
  allocated=${allocated##*:}
  SRUNSH_GPUS_PER_NODE=${SRUNSH_GPUS_PER_NODE:-${allocated:-8}}
  is_positive_int "$SRUNSH_GPUS_PER_NODE" || return 0 # reported by validate
  if [[ -n $allocated ]] && ((SRUNSH_GPUS_PER_NODE > allocated)); then
    die "SRUNSH_GPUS_PER_NODE=$SRUNSH_GPUS_PER_NODE but job $SLURM_JOB_ID has $allocated GPU(s) a node:" \
      "set SRUNSH_GPUS_PER_NODE=$allocated or allocate more (salloc --gpus-per-node=$SRUNSH_GPUS_PER_NODE)"
  fi
  local cpus
  cpus=$(min_cpus_per_node "${SLURM_JOB_CPUS_PER_NODE:-}")
  if [[ -n $cpus ]] && ((cpus < SRUNSH_GPUS_PER_NODE)); then
    die "job $SLURM_JOB_ID has $cpus CPU(s) on a node for $SRUNSH_GPUS_PER_NODE ranks a node:" \
      "allocate whole nodes (salloc --exclusive) or at least --ntasks-per-node=$SRUNSH_GPUS_PER_NODE"
  fi
  CPUS_PER_RANK=${cpus:+$((cpus / SRUNSH_GPUS_PER_NODE))}
  command -v srun >/dev/null || ((DRY_RUN)) ||
    die "srun is not found on this host:" "run srun.sh where SLURM's client commands are"
}

# Where the ranks find the code, the recipe and the run directory: through SRUNSH_MOUNT in the container, else as here.
validate_paths() {
  local recipe_abs
  recipe_abs=$(realpath -- "$RECIPE")
  RUN_ROOT=$(realpath -m -- "$SRUNSH_OUTPUT_ROOT")/$(basename -- "$RECIPE" .py)
  if ((USE_CONTAINER)); then
    validate_image
    parse_mounts
    # The ranks run this checkout's code, not the copy baked into the image, so recipe and code always match.
    CODE_DIR=$(in_container "this checkout" "$REPO_DIR")
    RECIPE_ARG=$(in_container "recipe" "$recipe_abs")
    RUN_ROOT_IN=$(in_container "SRUNSH_OUTPUT_ROOT" "$RUN_ROOT")
    validate_output_mount
    TASK_WORKDIR=$(container_path "$(pwd -P)") || TASK_WORKDIR=$CODE_DIR
  else
    command -v "$SRUNSH_PYTHON" >/dev/null ||
      die "SRUNSH_PYTHON=$(q "$SRUNSH_PYTHON") is not found on this host:" \
        "install it or set SRUNSH_PYTHON=/path/to/python"
    if ((USE_NSYS)) && ! command -v "$SRUNSH_NSYS" >/dev/null; then
      die "--nsys needs nsys, but SRUNSH_NSYS=$(q "$SRUNSH_NSYS") is not found:" \
        "install Nsight Systems or set SRUNSH_NSYS=/path/to/nsys"
    fi
    CODE_DIR=$REPO_DIR RECIPE_ARG=$RECIPE RUN_ROOT_IN=$RUN_ROOT
  fi
}

validate() {
  [[ -f $RECIPE && -r $RECIPE ]] ||
    die "recipe $(q "$RECIPE") is not a readable file:" "check the path (relative to $(q "$PWD"))"
  CPUS_PER_RANK=''
  if ((SUBMITTING)); then
    # Only for the checks here: the job takes its own from its allocation.
    SRUNSH_GPUS_PER_NODE=${SRUNSH_GPUS_PER_NODE:-8}
  elif ((LOCAL)); then
    validate_local_gpus
  else
    validate_slurm_allocation
  fi
  is_positive_int "$SRUNSH_GPUS_PER_NODE" ||
    die "SRUNSH_GPUS_PER_NODE=$(q "$SRUNSH_GPUS_PER_NODE") is not a positive integer:" \
      "set it to the GPUs per node, e.g. SRUNSH_GPUS_PER_NODE=8"
  if [[ -n $MASTER_PORT ]] && ! { is_positive_int "$MASTER_PORT" && ((MASTER_PORT <= 65535)); }; then
    die "MASTER_PORT=$(q "$MASTER_PORT") is not a port number:" "set 1-65535 or leave it unset"
  fi
  if [[ -n $SRUNSH_CONTAINER_NAME && ! ($SRUNSH_CONTAINER_NAME =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$) ]]; then
    die "SRUNSH_CONTAINER_NAME=$(q "$SRUNSH_CONTAINER_NAME") is not a container name:" \
      "use letters, digits, '.', '_' and '-', or leave it unset for an unnamed container"
  fi
  if [[ -n $SRUNSH_RUN_ID && ! ($SRUNSH_RUN_ID =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$) ]]; then
    die "SRUNSH_RUN_ID=$(q "$SRUNSH_RUN_ID") is not a run name:" \
      "use letters, digits, '.', '_' and '-', as in 4242-20261130-101500"
  fi
  read -ra SRUN_EXTRA <<<"$SRUNSH_SRUN_EXTRA_ARGS"
  validate_health_knobs # launcher/health.sh
  validate_hang_knobs   # launcher/hang.sh
  validate_paths
}
