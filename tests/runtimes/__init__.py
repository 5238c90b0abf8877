"""Tests of the backends, a folder each as in pipeline/runtimes/; what every backend shares at this level."""
