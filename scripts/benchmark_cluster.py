"""What a cluster run costs beyond the work itself: per-task dispatch overhead, artefact transfer rate.

    python scripts/benchmark_cluster.py                        # a Ray instance started here
    python scripts/benchmark_cluster.py --address HOST:PORT    # an existing cluster (run on one of its machines)

Overhead: the round trip of the task the pipeline dispatches for each stage (a Ray streaming
generator that reports where it started, then its result) with an empty stage, one at a time and
many at once. Transfer: files of the given sizes sent the way a stage's inputs are (the driver puts
them in chunks, a node writes them into its content-addressed cache and verifies the sha256) and
sent back the way outputs are, on a node other than the driver's where the cluster has one.
Figures depend on the machine and network: report them with both named.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path


def empty_stage():
    import ray

    yield ("started", ray.get_runtime_context().get_node_id())
    yield ("result", None)


def receive_and_return(ref, back: bool):
    """A node's side of a transfer: materialize the file (verified), and optionally send it back."""
    import ray

    from pipeline.cluster.transfer import NodeBlobs, read_chunks

    with tempfile.TemporaryDirectory() as scratch:
        blobs = NodeBlobs(Path(scratch))
        started = time.perf_counter()
        blobs.materialize(ref, Path(scratch) / "copy.bin")
        took = time.perf_counter() - started
        chunks = read_chunks(Path(scratch) / "copy.bin") if back else None
    return ray.get_runtime_context().get_node_id(), took, chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="local")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[16, 128, 512])
    args = parser.parse_args()

    import ray

    from pipeline.cluster.connection import connect, disconnect
    from pipeline.cluster.transfer import DriverBlobs

    cluster = connect(args.address)
    driver_node = ray.get_runtime_context().get_node_id()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs; Ray {ray.__version__}; cluster {args.address}: {len(cluster.nodes)} node(s)")
    try:
        task = ray.remote(num_returns="streaming", max_retries=0, num_cpus=0)(empty_stage)

        def round_trip():
            handle = task.remote()
            return [ray.get(ref) for ref in handle]

        round_trip()  # start a worker process first: that cost is paid once per node
        serial = []
        for _ in range(min(args.tasks, 50)):
            started = time.perf_counter()
            round_trip()
            serial.append(time.perf_counter() - started)

        def burst() -> float:
            started = time.perf_counter()
            handles = [task.remote() for _ in range(args.tasks)]
            for handle in handles:
                for ref in handle:
                    ray.get(ref)
            return time.perf_counter() - started

        burst()  # the first burst also starts the worker processes Ray adds for it
        parallel = burst()
        print(
            f"dispatch: one task at a time {statistics.median(serial) * 1e3:.1f} ms median round trip "
            f"(p90 {statistics.quantiles(serial, n=10)[-1] * 1e3:.1f} ms); {args.tasks} at once {parallel / args.tasks * 1e3:.2f} ms per task "
            "(worker processes already started)"
        )

        others = [n for n in cluster.nodes if n.node_id != driver_node]
        target = others[0] if others else cluster.nodes[0]
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(num_cpus=0, max_retries=0)(receive_and_return).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(target.node_id, soft=False)
        )
        where = "another node" if others else "the driver's own node (the cluster has no other)"
        with tempfile.TemporaryDirectory() as folder:
            for size in args.sizes_mib:
                path = Path(folder) / f"{size}.bin"
                path.write_bytes(os.urandom(size << 20))
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                blobs = DriverBlobs(Path(folder))
                started = time.perf_counter()
                ref = blobs.file(path.name, digest, size << 20)
                put = time.perf_counter() - started
                started = time.perf_counter()
                _node, fetch, _ = ray.get(remote.remote(ref, False))
                there = time.perf_counter() - started
                started = time.perf_counter()
                _node, _fetch, chunks = ray.get(remote.remote(ref, True))
                back = time.perf_counter() - started
                received = sum(len(c) for c in chunks)
                assert received == size << 20
                print(
                    f"transfer {size:4d} MiB to {where}: put {size / put:7.0f} MiB/s, node fetch+verify {size / fetch:7.0f} MiB/s "
                    f"(task {size / there:6.0f} MiB/s end to end), there and back {2 * size / back:6.0f} MiB/s"
                )
    finally:
        disconnect()


if __name__ == "__main__":
    main()
