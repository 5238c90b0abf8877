#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one go: the `gpu` tests and the export benchmark
# (about 9 minutes on the lent H100). The gpu tests also build ViT-B's block formats with
# TensorRT-RTX 1.7, which they pull; on a machine without the package index, give pip the wheels:
# PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR (tensorrt-rtx-cu13-libs and -bindings 1.7.1.116).
#   bash scripts/gpu_check.sh OUT_DIR
# Writes OUT_DIR/gpu-tests.log, OUT_DIR/benchmark.log, OUT_DIR/export-one-process.json and
# OUT_DIR/export-fresh-processes.json.
set -uo pipefail
out="${1:?usage: gpu_check.sh OUT_DIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, timm, onnx, onnxruntime; print('torch', torch.__version__, 'timm', timm.__version__, 'onnx', onnx.__version__, 'ort', onnxruntime.__version__)" | tee -a "$out/gpu.txt"
python3 -m pytest -m gpu -v -p no:cacheprovider tests/stages/test_quantize_gpu.py 2>&1 | tee "$out/gpu-tests.log"
tests=${PIPESTATUS[0]}
# All variants in one process, as `make engines` runs them; then each in a fresh process.
variants="fp16 int8 fp8 mxfp8 nvfp4 nvfp4_sparse mxfp8_sparse"
python3 scripts/benchmark_export.py --one-process --variants $variants --out "$out/export-one-process.json" 2>&1 | tee "$out/benchmark.log"
one=${PIPESTATUS[0]}
python3 scripts/benchmark_export.py --variants $variants --out "$out/export-fresh-processes.json" 2>&1 | tee -a "$out/benchmark.log"
bench=$(( ${PIPESTATUS[0]} || one ))
# The cause of the old 80-90 s exports, building ModelOpt's INT8 kernel with nvcc in an empty
# cache, takes another 80 s; measure it with GPU_CHECK_KERNELS=1.
if [ "${GPU_CHECK_KERNELS:-0}" = 1 ]; then
  python3 scripts/benchmark_export.py --variants --modelopt-kernels get_cuda_ext --out "$out/kernel-build.json" 2>&1 | tee -a "$out/benchmark.log"
fi
echo "gpu tests exit $tests, benchmark exit $bench"
exit $(( tests || bench ))
