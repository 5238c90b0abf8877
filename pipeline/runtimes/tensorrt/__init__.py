"""The TensorRT backend through trtexec (kinds "trtexec-container" and "trtexec-local").

trtexec.py is what both kinds share (the flags each TensorRT release takes, reading its output);
in_container.py runs trtexec in a pinned NGC image (docker.py: the Docker SDK), local.py where it
is installed on this machine.
"""
