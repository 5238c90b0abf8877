"""The stages an engine goes through (export → build → profile), their shared base and the runner
that chains them.
"""
