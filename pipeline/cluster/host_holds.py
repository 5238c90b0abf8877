"""What a run on several GPUs of one host says, at its end, of how its shape points held that host.

A point whose engine's time is the host's (a launch-bound GPU engine, a CPU engine) holds the host
whole for its rounds (pipeline/measuring/host_rounds.py), so on one host such points are timed one at a time
whatever the number of GPUs: only what lies outside their rounds — exports, builds, other points'
preparing — overlaps. A user who gave `--gpus 0,1` and waited as long as on one GPU should read why
in the run's own output, not in the docs; each profile records how its rounds held the host
(``rounds[].host_held``), and this gathers those records per node.
"""

from __future__ import annotations

from collections import defaultdict


class HostHolds:
    """The holds of the points a run timed, per node, and the sentence they make."""

    def __init__(self):
        self._by_node: dict[str, list[str | None]] = defaultdict(list)
        self._nodes: dict[str, tuple[str, int]] = {}  # node id → its label and GPUs

    def note(self, node, manifests: list) -> None:
        """A point finished on ``node``: its profiles' manifests (one hold for the point: its
        engines share one set of rounds)."""
        from pipeline.cluster.connection import gpus_of

        for manifest in manifests:
            record = manifest.stage("profile")
            rounds = getattr(getattr(record, "details", None), "rounds", None) or []
            if rounds:
                self._by_node[node.node_id].append(rounds[0].host_held)
                self._nodes[node.node_id] = (node.label(), int(gpus_of(node.resources) or 0))
                return

    def sentences(self) -> list[str]:
        """One sentence for each node of two GPUs or more that timed two points or more."""
        out = []
        for node_id, holds in self._by_node.items():
            label, gpus = self._nodes[node_id]
            words = held_words(holds, gpus)
            if words:
                out.append(f"{label}: {words}")
        return out


def held_words(holds: list[str | None], gpus: int) -> str | None:
    """How ``holds`` (each point's: "whole", "shared", None) shared a host of ``gpus`` GPUs, or
    None where nothing could have run beside anything (one GPU, one point)."""
    whole, shared = holds.count("whole"), holds.count("shared")
    if gpus < 2 or whole + shared < 2:
        return None
    if whole == 0:
        return f"every one of its {shared} shape points ran its rounds beside the others' (every engine GPU-bound)."
    beside = {
        0: "none ran its rounds beside another's: its other GPUs shortened only the work outside the rounds",
        1: "the other one ran its rounds beside other points'",
    }.get(shared, f"the other {shared} ran theirs beside other points'")
    return (
        f"{whole} of its {whole + shared} shape points held the host whole for their rounds (an engine whose time is the "
        f"host's: launch-bound or on the CPU), so those rounds ran one at a time on its {gpus} GPUs; {beside} "
        "(docs/cluster.md)."
    )
