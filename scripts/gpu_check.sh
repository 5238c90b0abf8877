#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one go: the `gpu` tests and the export benchmark.
#   bash scripts/gpu_check.sh OUT_DIR
# Writes OUT_DIR/gpu-tests.log, OUT_DIR/benchmark.log and OUT_DIR/export-benchmark.json.
set -uo pipefail
out="${1:?usage: gpu_check.sh OUT_DIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, timm, onnx, onnxruntime; print('torch', torch.__version__, 'timm', timm.__version__, 'onnx', onnx.__version__, 'ort', onnxruntime.__version__)" | tee -a "$out/gpu.txt"
python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_quantize_gpu.py 2>&1 | tee "$out/gpu-tests.log"
tests=${PIPESTATUS[0]}
# Every variant once in a fresh process; mxfp8 a second time to show the warm kernel cache.
python3 scripts/benchmark_export.py --variants fp16 int8 fp8 mxfp8 nvfp4 nvfp4_sparse mxfp8_sparse mxfp8 \
  --out "$out/export-benchmark.json" 2>&1 | tee "$out/benchmark.log"
bench=${PIPESTATUS[0]}
# The cause of the old 80-90 s exports: building ModelOpt's INT8 kernel with nvcc in an empty cache.
python3 scripts/benchmark_export.py --variants --modelopt-kernels get_cuda_ext --out "$out/kernel-build.json" 2>&1 | tee -a "$out/benchmark.log"
echo "gpu tests exit $tests, benchmark exit $bench"
exit $(( tests || bench ))
