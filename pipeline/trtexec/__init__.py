"""Everything about trtexec: its command line per TensorRT release, and parsers for what it prints
and exports. Parsing happens once, into typed objects; reports read those, never raw text."""
