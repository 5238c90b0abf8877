# Set-up and everyday jobs. `make help` lists them.
#
#   make demo                 set up (first time) and run the main job on ONNX Runtime
#   make setup EXTRAS=cluster also install Ray, for `--cluster` (each node of a cluster needs it too)
#   make test                 set up (first time) and run the tests
#   make lint                 ruff and the import-layer contract, as CI runs them
#   make engines TRT=10.14    build every variant of MODEL with that TensorRT toolchain
#   make engines TOOLCHAIN=trt-rtx1.7 ARCH=sm120    … or with any toolchain, for chosen GPUs
#   make engines TRT=11.1 DRY_RUN=1                  print the exact commands and stop (no GPU needed)
#   make engines TRT=10.14 CLUSTER=head:6379         … on a Ray cluster, for every GPU type it has
#   make profile TRT=10.14    profile them

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIPELINE := $(BIN)/pipeline
# The small CPU build of torch by default (`pip install timm` alone pulls ~5.8 GB of CUDA torch),
# from PyTorch's CPU wheel index (pytorch.org/get-started/locally: Linux or Windows, pip, CPU) where
# it answers within seconds, else from pip's own indexes (scripts/install_torch.py says which).
# macOS wheels are CPU builds already: pip's own indexes. TORCH_INDEX= uses pip's own indexes
# anywhere; TORCH_INDEX=URL another index (a mirror of PyTorch's, say).
TORCH_PACKAGES ?= torch==2.13.0 torchvision==0.28.0
TORCH_INDEX ?= $(if $(filter Darwin,$(shell uname -s 2>/dev/null)),,https://download.pytorch.org/whl/cpu)
# A TORCH_INDEX the user named (command line or environment) is used or the set-up fails; only the
# default falls back to pip's own indexes. On a machine with an NVIDIA GPU a CUDA torch already
# installed is kept, else the CUDA build comes from pip's own indexes.
TORCH_NAMED = $(if $(filter command line environment,$(origin TORCH_INDEX)),--named)
MODEL ?= vit
TRT ?=
TOOLCHAIN ?=
ARCH ?=
PYTEST_ARGS ?=
# Optional extras beside the default ones, comma-separated: cluster (Ray, for --cluster).
EXTRAS ?=
# A Ray cluster's HOST:PORT to fan the work out over (README: "Beyond one machine").
CLUSTER ?=
# --trt VERSION or --toolchain NAME, one --arch per architecture in ARCH, and --cluster.
CHAIN = $(if $(TRT),--trt $(TRT),--toolchain $(TOOLCHAIN)) $(foreach arch,$(ARCH),--arch $(arch)) $(if $(CLUSTER),--cluster $(CLUSTER))

.DEFAULT_GOAL := help
.PHONY: help setup demo engines profile compare doctor test lint clean

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup: $(VENV)/.installed ## Create .venv and install the pipeline with its test tools (EXTRAS=cluster adds Ray).

$(VENV)/.installed: pyproject.toml $(if $(EXTRAS)$(TORCH_NAMED),FORCE)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(strip $(TORCH_PACKAGES)),$(BIN)/python scripts/install_torch.py --index '$(TORCH_INDEX)' $(TORCH_NAMED) $(TORCH_PACKAGES))
	$(BIN)/python -m pip install -q -e '.[all,test$(if $(EXTRAS),$(comma)$(EXTRAS))]'
	touch $@

comma := ,
.PHONY: FORCE
FORCE:

demo: setup ## The main job on the embedded runtime: vit_tiny fp32/fp16/int8 → compare.
	$(PIPELINE) run

engines: setup ## Build every variant of MODEL (default vit): make engines TRT=10.14, or TOOLCHAIN=trt-rtx1.7 ARCH=sm120.
	@test -n "$(TRT)$(TOOLCHAIN)" || { echo "ERROR neither TRT nor TOOLCHAIN is set" >&2; echo "TIP make engines TRT=10.14 (or TOOLCHAIN=trt-rtx1.7 ARCH=sm120)" >&2; exit 2; }
	$(PIPELINE) build --model $(MODEL) $(CHAIN) $(if $(DRY_RUN),--dry-run)

profile: setup ## Profile every variant of MODEL: make profile TRT=10.14 (or TOOLCHAIN=…).
	@test -n "$(TRT)$(TOOLCHAIN)" || { echo "ERROR neither TRT nor TOOLCHAIN is set" >&2; echo "TIP make profile TRT=10.14" >&2; exit 2; }
	$(PIPELINE) profile --model $(MODEL) $(CHAIN) $(if $(DRY_RUN),--dry-run)

compare: setup ## Print the comparison table from the saved manifests.
	$(PIPELINE) compare

doctor: setup ## Show what this machine can run.
	$(PIPELINE) doctor

test: setup ## Run the test suite (GPU/Docker tests skip with their reason when unavailable).
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup ## Check style (ruff) and the architecture's import layers (import-linter).
	$(BIN)/ruff check pipeline tests scripts
	$(BIN)/ruff format --check pipeline tests scripts
	$(BIN)/lint-imports

clean: ## Delete the outputs: models/ engines/ manifests/ reports/.
	rm -rf models engines manifests reports
