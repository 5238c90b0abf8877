"""`python -m pipeline`: the command line, as the `pipeline` script runs it."""

import sys

from pipeline.cli import main

sys.exit(main())
