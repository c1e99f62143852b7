# Build the training image and its enroot squash file; format, lint and test the toolkit.
#
#   make build                                   # docker build, then enroot import -> ./megatron-lm+latest.sqsh
#   make build IMAGE_NAME=team/megatron TAG=v1   # -> ./team+megatron+v1.sqsh
#   make build OUTPUT_DIR=/fsx/images            # write the squash file where every node can read it
#   make test                                    # create .venv when versions changed, lint, then run pytest
# Set on make's command line only: a TAG or OUTPUT_DIR that the environment holds for another tool must not rename
# the image or move its squash file (make's command line overrides these; the environment does not).
IMAGE_NAME = megatron-lm
TAG = latest
OUTPUT_DIR = .

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

VENV := .venv
STAMP := $(VENV)/.installed
SQSH = $(OUTPUT_DIR)/$(subst /,+,$(IMAGE_NAME))+$(TAG).sqsh

# The NAME=VALUE lines of the [image] section of versions.txt: each one becomes a docker --build-arg.
IMAGE_PINS = $(shell sed -n '/^\[image\]/,/^\[/{/^[A-Za-z_][A-Za-z0-9_]*=/p;}' versions.txt)
EMPTY_PINS = $(patsubst %=,%,$(filter %=,$(IMAGE_PINS)))
SHELL_SCRIPTS = $(shell find . -name '*.sh' -not -path './.venv/*' -not -path './.git/*' -not -path './.devkit/*' -not -path './.deepep/*')

.PHONY: build sqsh clean fmt lint test

build:
	$(if $(IMAGE_PINS),,$(error versions.txt has no [image] pins))
	$(if $(EMPTY_PINS),$(error versions.txt: [image] pin without a value: $(EMPTY_PINS)))
	./enroot.sh -f Dockerfile -i . -o "$(OUTPUT_DIR)" -n "$(IMAGE_NAME):$(TAG)" -- $(addprefix --build-arg ,$(IMAGE_PINS))

# The reference design's name for the same step: the squash file is what build produces.
sqsh: build

clean:
	if command -v docker >/dev/null; then docker rmi -f "$(IMAGE_NAME):$(TAG)" || true; fi
	rm -f "$(SQSH)"

fmt: $(STAMP)
	$(VENV)/bin/ruff format .

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/shellcheck $(SHELL_SCRIPTS)
	$(VENV)/bin/hadolint Dockerfile

test: $(STAMP) lint
	. $(VENV)/bin/activate && pytest

# tools/setup_test_env.sh is idempotent and touches the stamp when it is done.
$(STAMP): versions.txt tools/setup_test_env.sh tools/install_python_stack.sh
	bash tools/setup_test_env.sh
