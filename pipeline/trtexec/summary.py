"""Human-readable rendering of a parsed trtexec run."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from pipeline.trtexec.report import TrtexecRun

_FIELDS = (("Latency", "latency_ms"), ("GPU Compute", "gpu_compute_ms"), ("Enqueue", "enqueue_ms"), ("H2D", "h2d_ms"), ("D2H", "d2h_ms"))


def render_run(run: TrtexecRun):
    log = run.log
    parts = []
    device = log.device
    header = Text()
    header.append(f"TensorRT {log.trt_version or '?'}" + (f" [{log.build_tag}]" if log.build_tag else ""))
    header.append(f" · {log.status or 'no PASSED/FAILED line'}", style="green" if log.status == "PASSED" else "red")
    if device.name:
        header.append(f" · {device.name} (CC {device.compute_capability}, {device.sms} SMs, {device.memory_mib} MiB)")
    parts.append(header)
    totals = [
        f"{label} {value:g}{unit}"
        for label, value, unit in (
            ("Throughput", log.throughput_qps, " qps"),
            ("host walltime", log.total_host_walltime_s, " s"),
            ("GPU compute", log.total_gpu_compute_s, " s"),
        )
        if value is not None
    ]
    if totals:
        parts.append(Text(" · ".join(totals)))
    if len(log.summaries) > 1:
        parts.append(_runs(log))
    timings = Table(title="Performance summary (ms)")
    for column in ("metric", "min", "median", "mean", "p90", "p95", "p99", "max"):
        timings.add_column(column, justify="left" if column == "metric" else "right")
    for label, field in _FIELDS:
        summary = getattr(log, field)
        if summary is not None:
            timings.add_row(
                label,
                *(
                    f"{getattr(summary, k):g}" if getattr(summary, k) is not None else "–"
                    for k in ("min", "median", "mean", "p90", "p95", "p99", "max")
                ),
            )
    if timings.row_count:
        parts.append(timings)
    if log.tensors:
        parts.append(_tensors(log))
    if log.profile and log.profile.layers:
        layers = Table(title=f"Slowest layers ({log.profile.iterations} iterations)")
        for column in ("layer", "avg ms", "%"):
            layers.add_column(column, justify="left" if column == "layer" else "right")
        for layer in sorted(log.profile.layers, key=lambda entry: -entry.average_ms)[:10]:
            layers.add_row(layer.name[:90], f"{layer.average_ms:g}", f"{layer.percent:g}")
        parts.append(layers)
    if run.layer_info is not None and run.layer_info.unknown_keys:
        parts.append(
            Text(
                f"warning: the layer information has keys this version does not know: {', '.join(run.layer_info.unknown_keys)}",
                style="yellow",
            )
        )
    if run.precision_audit is not None:
        audit = run.precision_audit
        parts.append(Text(f"Layer output types: {audit.output_types}"))
        if audit.warning:
            parts.append(Text(f"WARNING {audit.warning}", style="yellow"))
    for warning in log.warnings:
        parts.append(Text(f"warning: {warning}", style="yellow"))
    for error in log.errors:
        parts.append(Text(f"error{f' {error.code}' if error.code is not None else ''}: {error.message}", style="red"))
    return Group(*parts)


def _tensors(log) -> Table:
    """Each input with the range it was built for (per optimization profile) and the shape it ran at;
    each output with its binding."""
    table = Table(title="Inputs and outputs")
    for column in ("tensor", "io", "min", "opt", "max", "ran at", "type"):
        table.add_column(column, justify="left" if column in ("tensor", "io", "type") else "right")
    for tensor in log.tensors:
        ran_at = tensor.ran_at or "–"
        profiles = sorted(tensor.profiles.items()) or [(None, None)]
        for index, (number, shapes) in enumerate(profiles):
            label = tensor.name if number is None or len(profiles) == 1 else f"{tensor.name} (profile {number})"
            label += " *" if tensor.from_command_line else ""
            built = (shapes.min, shapes.opt, shapes.max) if shapes is not None else ("–", "–", "–")
            table.add_row(label, tensor.io, *built, ran_at if index == 0 else "", tensor.dtype or "–")
    if any(tensor.from_command_line for tensor in log.tensors):
        table.caption = "* shapes read from the command in trtexec's &&&& line: no other line of the text states them"
    return table


def _runs(log) -> Table:
    """One line per performance summary of a text that holds several runs."""
    table = Table(title=f"{len(log.summaries)} runs in this text (the figures above are the last one's)")
    for column in ("run", "qps", "GPU median ms", "GPU mean ms", "GPU p99 ms", "total GPU s"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for index, summary in enumerate(log.summaries, 1):
        gpu = summary.gpu_compute_ms

        def shown(value):
            return f"{value:g}" if value is not None else "–"

        table.add_row(
            summary.label or str(index),
            shown(summary.throughput_qps),
            shown(gpu.median if gpu else None),
            shown(gpu.mean if gpu else None),
            shown(gpu.p99 if gpu else None),
            shown(summary.total_gpu_compute_s),
        )
    return table
