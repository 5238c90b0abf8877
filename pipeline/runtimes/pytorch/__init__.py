"""The PyTorch backend (kind "torch"): eager, torch.compile and CUDA graphs, the baseline every engine
is measured against.

runtime.py is the toolchain (TorchRuntime); spec.py its catalog settings; engine_file.py the engine
file (the model's weights); preparing.py and prepared.py make a model ready at a shape point and
time it; memory.py the GPU memory an engine holds; pair.py eager and compiled side by side;
compile_ahead.py compiles every shape point in processes of their own, as many as compile_sizing.py
says the machine allows, served.py times them there;
cache.py keeps compiled work in the workspace.
"""
