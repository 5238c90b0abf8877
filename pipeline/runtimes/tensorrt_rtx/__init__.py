"""The TensorRT-RTX backend (kind "tensorrt-rtx"): a TensorRT compiler installed from the package
index, one release per toolchain.

runtime.py is the toolchain; spec.py its catalog settings; release.py installs a release in an
environment of its own and runs driver.py there, a script that builds and times with that
release's bindings and reaches CUDA through cuda.py; reports.py reads what the driver wrote.
"""
