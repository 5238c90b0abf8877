"""ONNX graphs as TensorRT's ONNX parser will read them, with the tools TensorRT engineers use
(Polygraphy, ONNX's checker): a user's graph linted before anything is built (``lint``), a graph
cleaned of what constant folding removes before a TensorRT build (``sanitize``), and a graph whose
build failed cut down to the smallest that still fails the same way (``reduce``); and what ONNX
Runtime's CPU provider cannot run (``onnxruntime_cpu``), for the export's parity check and the ONNX
Runtime backend alike.

Nothing here knows a toolchain: the reducer is handed the check that builds a graph."""
