"""How a command runs: its one error type for user errors and the others (errors.py), its
progress and messages on the terminal (reporting.py), interruptions (signals.py), a GPU fault that
moves the run to a fresh process (faults.py), and the user's own Python it loads (user_code.py).
Import the module you need."""
