"""What changed between two engines, layer by layer (`pipeline diff`).

Each side is an engine of this workspace (its build's layer information and its profile's
per-layer times) or trtexec output a user brings (a log with a ``=== Profile`` table or a
``--dumpLayerInfo`` dump, ``--exportProfile`` / ``--exportLayerInfo`` JSON, or a folder of them).

Two builds rarely name their layers alike: TensorRT fuses differently across releases and
precisions (10.x ``node_conv2d + node_relu`` is 11.x's ``node_conv2d_myl0_2``), and Myelin numbers
its layers per graph (``__myl_Resh_myl5_1`` vs ``__myl_Resh_myl0_6``). Layers are therefore matched
in three passes: by name; by name without the Myelin numbering; then by the ONNX nodes each layer
implements (its ``[ONNX Layer: …]`` metadata, else the node names a fused name lists), so that
layers fused differently are compared as a group. What is left is "only in A" / "only in B".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pipeline.running.errors import PipelineError, UsageError
from pipeline.trtexec.layers import MATH_TYPES, NO_OUTPUT, EngineLayer, LayerInfo

KINDS = ("matched", "matched by ONNX nodes", "fused differently", "only in A", "only in B")
TOP = 10


@dataclass
class TimedLayer:
    name: str
    average_ms: float
    percent: float | None = None


@dataclass
class EngineSide:
    """One engine as the diff sees it."""

    label: str
    model: str | None = None
    runtime: str | None = None  # what its runtime is called ("TensorRT", "ONNX Runtime"), and its version
    runtime_version: str | None = None
    timed: list[TimedLayer] | None = None  # per-layer times, in the profile's order
    iterations: int | None = None
    info: LayerInfo | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def total_ms(self) -> float | None:
        return sum(layer.average_ms for layer in self.timed) if self.timed else None


@dataclass
class SideLayer:
    name: str
    ms: float | None
    layer: EngineLayer | None
    nodes: tuple[str, ...]
    index: int


@dataclass
class DiffRow:
    kind: str
    a: list[SideLayer]
    b: list[SideLayer]

    @staticmethod
    def _ms(layers: list[SideLayer]) -> float | None:
        times = [layer.ms for layer in layers if layer.ms is not None]
        return sum(times) if times and len(times) == len(layers) else None

    @property
    def a_ms(self) -> float | None:
        return self._ms(self.a)

    @property
    def b_ms(self) -> float | None:
        return self._ms(self.b)

    def delta_ms(self, a_timed: bool, b_timed: bool) -> float | None:
        """B − A; a side with no layer here counts 0 when that side has times at all."""
        a = self.a_ms if self.a else (0.0 if a_timed else None)
        b = self.b_ms if self.b else (0.0 if b_timed else None)
        return None if a is None or b is None else b - a

    @staticmethod
    def _describe(layers: list[SideLayer], what: str) -> str | None:
        values = [getattr(layer.layer, what) for layer in layers if layer.layer is not None]
        values = list(dict.fromkeys(v for v in values if v))
        return "+".join(values) if values else None

    def precision(self, side: str) -> str | None:
        return self._describe(self.a if side == "a" else self.b, "precision")

    def layer_type(self, side: str) -> str | None:
        return self._describe(self.a if side == "a" else self.b, "layer_type")

    def tactic(self, side: str) -> str | None:
        return self._describe(self.a if side == "a" else self.b, "tactic")

    @property
    def changed(self) -> list[str]:
        """What differs in a matched row besides time: precision, layer type, tactic."""
        if not (self.a and self.b):
            return []
        changed = []
        for what in ("precision", "layer_type", "tactic"):
            a, b = getattr(self, what)("a"), getattr(self, what)("b")
            if a is not None and b is not None and a != b:
                changed.append(what.replace("_", " "))
        return changed


@dataclass
class LayerDiff:
    a: EngineSide
    b: EngineSide
    rows: list[DiffRow]

    @property
    def timed(self) -> tuple[bool, bool]:
        return bool(self.a.timed), bool(self.b.timed)

    def delta(self, row: DiffRow) -> float | None:
        return row.delta_ms(*self.timed)

    def counts(self) -> dict[str, int]:
        return {kind: sum(1 for row in self.rows if row.kind == kind) for kind in KINDS}

    def top(self, count: int = TOP) -> list[DiffRow]:
        """The rows that explain most of the difference in time, largest first."""
        timed = [row for row in self.rows if self.delta(row) is not None]
        return sorted(timed, key=lambda row: -abs(self.delta(row)))[:count]

    def precision_verdict(self) -> list[str]:
        """In words: which precisions each engine's layers compute in, where they differ."""
        if self.a.info is None or self.b.info is None or not (self.a.info.layers and self.b.info.layers):
            missing = [side.label for side in (self.a, self.b) if side.info is None or not side.info.layers]
            return [f"no detailed layer information for {' and '.join(missing)}: precisions cannot be compared"]
        a, b = self.a.info.audit().precisions, self.b.info.audit().precisions
        sentences = []
        narrowest_first = MATH_TYPES
        for precision in sorted(set(a) | set(b), key=lambda p: narrowest_first.index(p) if p in narrowest_first else len(narrowest_first)):
            if precision == NO_OUTPUT or a.get(precision, 0) == b.get(precision, 0):
                continue
            more, fewer = ("A", "B") if a.get(precision, 0) > b.get(precision, 0) else ("B", "A")
            high, low = max(a.get(precision, 0), b.get(precision, 0)), min(a.get(precision, 0), b.get(precision, 0))
            sentences.append(f"{more} runs {high} layers in {precision}, {fewer} {low or 'none'}.")
        return sentences or [f"Both run the same precisions: {_counts(a)}."]

    def summary(self) -> list[str]:
        lines = []
        a_total, b_total = self.a.total_ms, self.b.total_ms
        if a_total is not None and b_total is not None:
            change = (b_total - a_total) / a_total * 100 if a_total else float("nan")
            lines.append(f"Total (sum of per-layer averages): A {a_total:.4f} ms, B {b_total:.4f} ms ({change:+.1f}%).")
        counts = self.counts()
        lines.append(" · ".join(f"{kind} {counts[kind]}" for kind in KINDS))
        return lines

    def to_json(self) -> dict[str, Any]:
        def side(engine: EngineSide) -> dict[str, Any]:
            return {
                "label": engine.label,
                "model": engine.model,
                # The runtime's version whichever runtime it is (named so when only TensorRT's was read).
                "trt_version": engine.runtime_version,
                "layers_timed": len(engine.timed) if engine.timed else 0,
                "layers_described": len(engine.info.layers) if engine.info else 0,
                "iterations": engine.iterations,
                "total_ms": engine.total_ms,
                "precisions": engine.info.audit().precisions if engine.info else {},
                "notes": engine.notes,
            }

        def row(entry: DiffRow) -> dict[str, Any]:
            return {
                "kind": entry.kind,
                "a": [layer.name for layer in entry.a],
                "b": [layer.name for layer in entry.b],
                "a_ms": entry.a_ms,
                "b_ms": entry.b_ms,
                "delta_ms": self.delta(entry),
                "a_precision": entry.precision("a"),
                "b_precision": entry.precision("b"),
                "a_type": entry.layer_type("a"),
                "b_type": entry.layer_type("b"),
                "a_tactic": entry.tactic("a"),
                "b_tactic": entry.tactic("b"),
                "changed": entry.changed,
                "onnx_nodes": sorted({n for layer in entry.a + entry.b for n in layer.nodes}),
            }

        return {
            "a": side(self.a),
            "b": side(self.b),
            "precision": self.precision_verdict(),
            "summary": self.summary(),
            "counts": self.counts(),
            "top": [row(entry) for entry in self.top()],
            "rows": [row(entry) for entry in self.rows],
        }


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items(), key=lambda item: -item[1])) or "none"


# --- matching ------------------------------------------------------------------------------------

_MYELIN_SUFFIX = re.compile(r"_myl\d+_\d+$")
_MYELIN_ENTRY = re.compile(r"^__mye\d+(?:_\d+)?")


def canonical(name: str) -> str:
    """A layer name without the numbering one build gives it: ``node_conv2d_myl0_1`` → ``node_conv2d``."""
    return _MYELIN_ENTRY.sub("__mye", _MYELIN_SUFFIX.sub("", name))


def nodes_of(name: str, layer: EngineLayer | None) -> tuple[str, ...]:
    """The ONNX nodes a layer implements: its metadata, else the nodes a fused name lists
    (``node_conv2d + node_relu``). Internal layers (``__myl_…``, reformats) name none."""
    if layer is not None and layer.onnx_nodes:
        return tuple(layer.onnx_nodes)
    if name.startswith("__") or name.startswith(("Reformatting ", "Reformatted ")) or "ForeignNode[" in name:
        return ()
    return tuple(canonical(part.strip()) for part in name.split(" + ") if part.strip())


def side_layers(side: EngineSide) -> list[SideLayer]:
    info = side.info
    if side.timed:
        layers = [(t.name, t.average_ms, info.layer(t.name) if info else None) for t in side.timed]
    elif info is not None and info.layers:
        layers = [(layer.name, None, layer) for layer in info.layers]
    elif info is not None:
        layers = [(name, None, None) for name in info.layer_names]
    else:
        layers = []
    return [SideLayer(name, ms, layer, nodes_of(name, layer), index) for index, (name, ms, layer) in enumerate(layers)]


def match(a: list[SideLayer], b: list[SideLayer]) -> list[DiffRow]:
    rows: list[DiffRow] = []
    free_a, free_b = list(a), list(b)
    for key in (lambda layer: layer.name, lambda layer: canonical(layer.name)):
        waiting: dict[str, list[SideLayer]] = {}
        for layer in free_b:
            waiting.setdefault(key(layer), []).append(layer)
        for layer in list(free_a):
            candidates = waiting.get(key(layer))
            if candidates:
                partner = candidates.pop(0)
                rows.append(DiffRow("matched", [layer], [partner]))
                free_a.remove(layer)
                free_b.remove(partner)
    rows += _group_by_nodes(free_a, free_b)
    grouped = {id(layer) for row in rows for layer in row.a + row.b}
    rows += [DiffRow("only in A", [layer], []) for layer in free_a if id(layer) not in grouped]
    rows += [DiffRow("only in B", [], [layer]) for layer in free_b if id(layer) not in grouped]
    return _in_order(rows)


def _group_by_nodes(a: list[SideLayer], b: list[SideLayer]) -> list[DiffRow]:
    """Layers of A and B that implement a common ONNX node, as connected groups."""
    layers = [("a", layer) for layer in a if layer.nodes] + [("b", layer) for layer in b if layer.nodes]
    parent = list(range(len(layers)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    owner: dict[str, int] = {}
    for index, (_, layer) in enumerate(layers):
        for node in layer.nodes:
            if node in owner:
                parent[root(index)] = root(owner[node])
            else:
                owner[node] = index
    groups: dict[int, list[tuple[str, SideLayer]]] = {}
    for index, entry in enumerate(layers):
        groups.setdefault(root(index), []).append(entry)
    rows = []
    for members in groups.values():
        group_a = [layer for side, layer in members if side == "a"]
        group_b = [layer for side, layer in members if side == "b"]
        if group_a and group_b:
            kind = "matched by ONNX nodes" if len(group_a) == len(group_b) == 1 else "fused differently"
            rows.append(DiffRow(kind, group_a, group_b))
    return rows


def _in_order(rows: list[DiffRow]) -> list[DiffRow]:
    """Rows in A's layer order; a layer only in B goes after the row holding the B layer before it."""
    keyed = {id(row): float(min(layer.index for layer in row.a)) for row in rows if row.a}
    by_b = sorted(((min(layer.index for layer in row.b), row) for row in rows if row.b), key=lambda item: item[0])
    previous = -1.0
    for position, (_, row) in enumerate(by_b):
        if id(row) in keyed:
            previous = keyed[id(row)]
        else:
            keyed[id(row)] = previous + 0.5 + position * 1e-6
    return sorted(rows, key=lambda row: keyed[id(row)])


def diff(a: EngineSide, b: EngineSide) -> LayerDiff:
    if a.model and b.model and a.model != b.model:
        raise UsageError(
            f"{a.label} is an engine of {a.model} and {b.label} one of {b.model}: different models have no layers to match.",
            hint="diff two toolchains or releases of one engine, or two variants of one model",
        )
    layers_a, layers_b = side_layers(a), side_layers(b)
    for side, layers in ((a, layers_a), (b, layers_b)):
        if not layers:
            raise PipelineError(f"{side.label} has neither per-layer times nor layer information.", hint=how_to_get_layers(side.runtime))
    rows = match(layers_a, layers_b)
    if not any(row.a and row.b for row in rows):
        raise UsageError(
            f"no layer of {a.label} matches one of {b.label} by name or by ONNX node: these look like different models.",
            hint="diff two builds of the same model",
        )
    return LayerDiff(a, b, rows)


def how_to_get_layers(runtime: str | None = None) -> str:
    """How a side would get layers; none for a workspace engine of a runtime that records neither."""
    if runtime is not None and "TensorRT" not in runtime:
        return f"{runtime} records no per-layer times or layer information, so its engines have none to diff: diff TensorRT or TensorRT-RTX engines (docs/diff.md)"
    return (
        "`pipeline profile` writes the per-layer profile and `pipeline build` the layer information of a workspace "
        "engine; from trtexec: --dumpProfile --exportProfile=… for times, --profilingVerbosity=detailed "
        "--exportLayerInfo=… for layers"
    )


# --- rendering -----------------------------------------------------------------------------------

FORMATS = ("table", "md", "json", "html")


def _ms(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "–"


def _signed(value: float | None) -> str:
    return f"{value:+.4f}" if value is not None else "–"


def _names(layers: list[SideLayer], width: int = 70) -> str:
    text = " + ".join(layer.name for layer in layers) if layers else "–"
    return text if len(text) <= width else text[: width - 1] + "…"


def _side_line(name: str, side: EngineSide) -> str:
    facts = [" ".join(word for word in (side.runtime, side.runtime_version) if word) if side.runtime_version else None]
    if side.timed:
        facts.append(f"{len(side.timed)} layers timed" + (f" over {side.iterations} iterations" if side.iterations else ""))
    if side.info is not None:
        facts.append(f"{len(side.info.layer_names)} layers described ({side.info.source_format})")
    return f"{name} = {side.label}: " + ", ".join(fact for fact in facts if fact)


def header_lines(result: LayerDiff) -> list[str]:
    lines = [_side_line("A", result.a), _side_line("B", result.b)]
    lines += [f"note ({side}): {note}" for side, engine in (("A", result.a), ("B", result.b)) for note in engine.notes]
    return lines


def render_terminal(result: LayerDiff):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(line) for line in header_lines(result)]
    parts += [Text(sentence, style="bold") for sentence in result.precision_verdict()]
    parts += [Text(line) for line in result.summary()]
    top = result.top()
    if top:
        explained = sum(result.delta(row) for row in top)
        table = Table(title=f"The {len(top)} layers that explain most of the difference (together {explained:+.4f} ms)")
        for column in ("A", "B", "kind", "A ms", "B ms", "Δ ms"):
            table.add_column(column, justify="right" if "ms" in column else "left")
        for row in top:
            table.add_row(_names(row.a, 50), _names(row.b, 50), row.kind, _ms(row.a_ms), _ms(row.b_ms), _signed(result.delta(row)))
        parts.append(table)
    table = Table(title="Every layer, A beside B")
    for column in ("A", "B", "kind", "A ms", "B ms", "Δ ms", "A prec", "B prec", "A type", "B type", "changed"):
        table.add_column(column, justify="right" if "ms" in column else "left")
    for row in result.rows:
        table.add_row(
            _names(row.a, 45),
            _names(row.b, 45),
            row.kind,
            _ms(row.a_ms),
            _ms(row.b_ms),
            _signed(result.delta(row)),
            row.precision("a") or "–",
            row.precision("b") or "–",
            row.layer_type("a") or "–",
            row.layer_type("b") or "–",
            ", ".join(row.changed),
        )
    parts.append(table)
    return Group(*parts)


def render_markdown(result: LayerDiff) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["# Layer diff", ""]
    lines += [f"- {cell(line)}" for line in header_lines(result)]
    lines += ["", *[f"**{sentence}**" for sentence in result.precision_verdict()], ""]
    lines += [*result.summary(), ""]
    top = result.top()
    if top:
        lines += [f"## The {len(top)} layers that explain most of the difference", ""]
        lines += ["| A | B | kind | A ms | B ms | Δ ms |", "|---|---|---|--:|--:|--:|"]
        lines += [
            f"| {cell(_names(r.a))} | {cell(_names(r.b))} | {r.kind} | {_ms(r.a_ms)} | {_ms(r.b_ms)} | {_signed(result.delta(r))} |"
            for r in top
        ]
        lines.append("")
    lines += ["## Every layer", ""]
    lines += [
        "| A | B | kind | A ms | B ms | Δ ms | A prec | B prec | A type | B type | changed |",
        "|---|---|---|--:|--:|--:|---|---|---|---|---|",
    ]
    for r in result.rows:
        lines.append(
            f"| {cell(_names(r.a))} | {cell(_names(r.b))} | {r.kind} | {_ms(r.a_ms)} | {_ms(r.b_ms)} | {_signed(result.delta(r))} "
            f"| {r.precision('a') or '–'} | {r.precision('b') or '–'} | {r.layer_type('a') or '–'} | {r.layer_type('b') or '–'} "
            f"| {', '.join(r.changed)} |"
        )
    return "\n".join(lines) + "\n"
