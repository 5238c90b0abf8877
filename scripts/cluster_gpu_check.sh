#!/usr/bin/env bash
# Cluster placement on a real GPU: `--cluster local` starts Ray on this machine, Ray detects the
# GPU's type itself (its "accelerator_type:<TYPE>" resource), and a PyTorch baseline is built and
# timed for that type on it (one GPU granted by Ray). Writes what it saw under $OUT (default ./gpu-check).
#
#   bash scripts/cluster_gpu_check.sh          # in a checkout with `make setup EXTRAS=cluster` done
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
PIPELINE="${PIPELINE:-python -m pipeline.cli}"
mkdir -p "$OUT/ws"
cp pipeline.toml "$OUT/ws/pipeline.toml"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
python - <<'PY' | tee "$OUT/ray-resources.txt"
import ray
ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR")
print({k: v for k, v in ray.cluster_resources().items() if not k.startswith(("node:", "memory", "object_store"))})
ray.shutdown()
PY
run() { $PIPELINE --catalog "$OUT/ws/pipeline.toml" "$@"; }
run run --cluster local --engine vit_tiny_fp32 --toolchain torch-eager 2>&1 | tee "$OUT/run.log"
run run --cluster local --engine vit_tiny_fp32 --toolchain torch-eager 2>&1 | tee "$OUT/rerun.log"
run compare --format json > "$OUT/compare.json"
python scripts/benchmark_cluster.py --sizes-mib 16 128 512 2>&1 | tee "$OUT/benchmark.txt"
cp -r "$OUT/ws/manifests" "$OUT/manifests"
