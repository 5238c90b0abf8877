"""Where work runs: the one room that starts other processes.

Work leaves the command's own process in five ways, all through here:

- a **child** (child.py): a new interpreter that does one piece of work and answers over one
  channel — a point's repeat in a fresh process (pipeline/stages/point.py), the Ray driver a
  cluster run watches (pipeline/cluster/supervisor.py) — or answers requests one at a time until
  told to stop: the processes that compile shape points ahead and then serve them
  (pipeline/runtimes/pytorch/compile_ahead.py, pytorch/served.py), which are first handed their
  points one at a time (handout.py: a child that dies owes only the job it held);
- the command **again, in a fresh process** (restart.py): after a kernel fault poisoned this one's
  CUDA context (pipeline/running/faults.py says which errors do);
- a **descriptor handed to a child** (child.py, ``inheritable``): the workspace lock a cluster
  driver holds with the command;
- **copies of this process** (shares.py): pure-Python work over many inputs split across the CPUs
  — `compare` reading thousands of manifests — forked, and only where this process holds no
  thread, CUDA or Ray; a share a copy fails at is done again here. Work done beside: one copy
  writing a file (compare's cache) while this process goes on, waited for at the end.

Every other child is a new interpreter (spawn), never a fork: CUDA and Ray cannot be forked. What a child
raises as the pipeline's own error reaches the parent as that error; a child that ends without a
word (killed, a crash in native code) is a PipelineError naming how it ended; an interrupted parent
stops its child before it goes. Which launcher runs a selection (this process, or a Ray cluster) is
the command line's choice (pipeline/cli/main.py): LocalLauncher (pipeline/stages/runner.py) and
ClusterLauncher (pipeline/cluster/supervisor.py) each take the context and a RunRequest.
"""
