"""The engine matrix on a Ray cluster (`--cluster ADDRESS`).

    connection.py  join the cluster, translate Ray's failures, probe what each node has
    scheduler.py   the driver: plan the matrix, place each stage by GPU type, retry lost tasks,
                   write results into the workspace as they finish
    worker.py      one stage on a node, in a scratch workspace, with the same Stage classes
    transfer.py    files through Ray's object store, by sha256, cached per node
    gpus.py        GPU type names → compute capability

Nothing here is imported unless `--cluster` is given, so Ray stays an optional extra.
"""
