"""How a command runs: its one error type for user errors and the others (errors.py), its
progress and messages on the terminal (reporting.py), interruptions (signals.py), a GPU fault that
moves the run to a fresh process (faults.py), the user's own Python it loads (user_code.py), files
written so that nothing half-written looks valid (files.py) and the machine's cache that outlives
any workspace (cache.py). Import the module you need."""
