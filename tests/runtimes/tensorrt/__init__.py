"""Tests of the trtexec backend (pipeline/runtimes/tensorrt/): in a container and installed locally."""
