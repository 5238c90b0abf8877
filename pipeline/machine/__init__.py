"""What this machine is: its GPUs as nvidia-smi reports them (nvidia_smi.py) and the versions and
hardware a manifest records (environment.py). Import the module you need."""
