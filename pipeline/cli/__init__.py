"""The `pipeline` command line: a thin layer that builds configurations and calls the library."""

from pipeline.cli.main import cli, main

__all__ = ["cli", "main"]
