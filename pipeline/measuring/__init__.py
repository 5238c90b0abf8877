"""How an engine is measured and judged: takes in paired rounds and when they stop (rounds.py,
stopping.py), the statistics of their times (stats.py), the host's speed and what slows it
(host_speed.py, host_rounds.py, machine_watch.py), the GPU's clock (sm_clock.py), NVML opened in
one place (nvml.py), an engine's outputs against the FP32 model's (accuracy.py), and running out
of GPU or host memory as a user error wherever a model runs in this process (out_of_memory.py).
Import the module you need."""
