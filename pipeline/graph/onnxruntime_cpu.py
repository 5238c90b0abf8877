"""What ONNX Runtime's CPU execution provider cannot run, for everything that runs an ONNX graph
there: the export's parity check (pipeline/stages/parity.py), which skips such a graph with the
reason, and the ONNX Runtime backend, which refuses to build it."""

# Precisions whose plain graphs the CPU execution provider cannot run, and why (measured: it
# refuses a BF16 graph at load, "Type 'tensor(bfloat16)' of input parameter ... of operator (Conv)").
NO_CPU_KERNELS = {"bf16": "ONNX Runtime's CPU execution provider has no bfloat16 Conv or MatMul kernels"}
