"""Preparing a PyTorch model to be timed: on its device in its dtype, run once eagerly, compiled by
torch.compile (its graph breaks counted, its cache recorded) or captured in a CUDA graph, with the
attention kernel the toolchain asks for — or a refusal that says why it cannot be (NotPrepared).
The PyTorch toolchain (pipeline/runtimes/pytorch/runtime.py) loads the model and hands it here; what comes
back (prepared.Prepared) is what the measurement protocol times.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

from pipeline.measuring.out_of_memory import is_out_of_memory, out_of_memory_as_error
from pipeline.running.errors import RefusedByTool
from pipeline.running.faults import fault_words
from pipeline.runtimes.pytorch.prepared import (
    Prepared,
    cache_keys_alike_in_every_process,
    capture,
    compiled_run,
    import_torch,
    kept_for_reference,
    no_grad,
    within,
)
from pipeline.runtimes.pytorch.sdpa import eager_sdpa_kernels, sdpa_kernels

# torch.compile's modes that capture the compiled model in CUDA graphs (torch/_inductor: "mode
# reduce-overhead ... uses CUDA graphs"; max-autotune too, unless "-no-cudagraphs").
CAPTURING_MODES = ("reduce-overhead", "max-autotune")
# The catalog's sdpa_backend → torch.nn.attention.SDPBackend's member.
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}


# The SDPA kernels an eager module ran, by what PyTorch chooses them by (_eager_sdpa_kernels).
_eager_sdpa: dict[tuple, list[str]] = {}


def compile_mode(spec) -> str | None:
    """torch.compile's mode for a toolchain's settings; None where it does not compile."""
    return (spec.mode or "default") if spec.backend == "compile" else None


def captures_graphs(spec) -> bool:
    """Whether torch.compile's mode captures the compiled model in CUDA graphs."""
    return compile_mode(spec) in CAPTURING_MODES


class NotPrepared(Exception):
    """torch.compile, or the attention kernel the toolchain asks for, refused the model: a fact
    about the model, the release and the GPU, recorded as a refusal (see RefusedByTool)."""

    def __init__(self, message: str, hint: str, facts: dict[str, Any]):
        super().__init__(message)
        self.message, self.hint, self.facts = message, hint, facts


class TorchPreparation:
    """A toolchain's settings (TorchSpec) applied to one model at one shape point."""

    def __init__(self, spec, reporter):
        self.spec, self.reporter = spec, reporter

    @property
    def mode(self) -> str | None:
        return compile_mode(self.spec)

    def prepare(
        self,
        model,
        examples: tuple,
        dtype,
        device: str,
        engine_file: tuple[int, int, int],
        shape: str | None,
        reuse: Prepared | None = None,
    ) -> Prepared:
        """``model`` ready to run on ``examples`` (CPU tensors; floating ones become ``dtype``), run
        once (compiled, captured, warmed) so that nothing is compiled inside a measurement. ``reuse``:
        the same model prepared at another shape point, whose dynamic compilation serves this one."""
        torch = import_torch()
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.spec.tf32
            torch.backends.cudnn.allow_tf32 = self.spec.tf32
        attention = self.attention_kernel(torch)
        with out_of_memory_as_error(int(examples[0].shape[0]), shape=shape):
            model = model.to(device)
            placed = tuple(t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device) for t in examples)
            facts: dict[str, Any] = {}
            compiled, compiled_at, first_output = None, None, None
            with attention():
                if self.spec.backend == "eager":
                    run = no_grad(lambda: model(*placed))
                    first_output = self._first_run(torch, run)  # a new tensor, no later run's
                elif self.spec.backend == "cudagraphs":
                    self.reporter.progress("capturing a CUDA graph")
                    run = self._first_run(torch, lambda: self._captured(torch, model, placed))
                else:
                    cache_keys_alike_in_every_process(torch)
                    if reuse is not None and reuse.compiled is not None and self.spec.dynamic:
                        self.reporter.progress(f"warming the dynamic compilation at {shape}")
                        compiled, compiled_at = reuse.compiled, reuse.compiled_at
                        run, facts = self._warm_compiled(torch, compiled, placed, reuse.facts)
                    else:
                        self.reporter.progress(f"compiling with torch.compile (mode {self.mode or 'default'})")
                        compiled, compiled_at = (
                            torch.compile(model, mode=self.mode, fullgraph=self.spec.fullgraph, dynamic=self.spec.dynamic),
                            shape,
                        )
                        run, facts = self._compile(torch, compiled, placed)
                    if getattr(self.spec, "capture", False) and device == "cuda":
                        run, facts = self.captured_compiled(torch, compiled, placed, facts)
            run = within(attention, run)
            # The kernel PyTorch chose for scaled-dot-product attention (it prefers cuDNN's where its
            # bundled cuDNN is new enough): a CUDA graph's replay passes no operator, so the eager
            # model it captured is asked instead.
            if self.spec.backend in ("eager", "cudagraphs"):
                chose = self._eager_sdpa_kernels(torch, within(attention, no_grad(lambda: model(*placed))), engine_file, examples, placed)
            else:
                chose = sdpa_kernels(torch, run)
            if chose:
                facts = {**facts, "sdpa_kernels": chose}
            wanted = self.spec.sdpa_backend
            if wanted and chose and chose != [wanted]:
                # Seen on the H100 (torch 2.11): compiled engines of one module asking for the
                # cudnn, efficient and flash kernels all ran flash, torch.compile's own choice, not
                # the SDPA setting's. Their times would be another kernel's under this name.
                raise NotPrepared(
                    f"the {wanted} SDPA kernel was asked for, but the prepared model ran {' and '.join(chose)}",
                    "compare SDPA kernels eagerly (sdpa_backend on an eager toolchain); compiled, PyTorch chooses its own",
                    {"sdpa_backend": wanted, "sdpa_kernels": chose},
                )
        run = self._refusing_later(run)
        kept = kept_for_reference(first_output)
        return Prepared(
            engine_file, run, placed, device, shape, facts, model, compiled, compiled_at, first_output=kept, tf32=self.spec.tf32
        )

    def _eager_sdpa_kernels(self, torch, run, engine_file: tuple[int, int, int], examples: tuple, placed: tuple) -> list[str]:
        """The SDPA kernels the eager module ran: asked once for each engine file, attention
        setting and inputs — their shapes, types and device, and their values, for a mask with no
        padding reaches SDPA as none at all (transformers), and a kernel without masks (flash)
        may then run — what PyTorch chooses them by. The eager and the CUDA-graph toolchains of
        one engine read one file (linked) and ask the same eager module at every shape point: a
        profiled run each, about 0.1 s on the lent H100's host, twelve of them in the seed
        matrix's engines prepared ahead."""
        import hashlib

        inputs = tuple(
            (
                tuple(t.shape),
                str(t.dtype),
                str(t.device),
                hashlib.blake2b(example.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest(),
            )
            for example, t in zip(examples, placed, strict=True)
        )
        key = (engine_file, self.spec.attn_implementation, self.spec.sdpa_backend, self.spec.tf32, inputs)
        if key not in _eager_sdpa:
            _eager_sdpa[key] = eager_sdpa_kernels(torch, run)
        return list(_eager_sdpa[key])

    def shared(self, leader: Prepared, engine_file: tuple[int, int, int]) -> Prepared:
        """This toolchain at ``leader``'s point from ``leader``'s compiled graph: a toolchain that
        differs from the leader's only by ``capture`` (pytorch/compile_ahead.py, graph_key), so the
        same kernels, compiled once. With ``capture``, the graph replayed from one CUDA graph;
        without, the compiled graph as the leader captured it."""
        torch = import_torch()
        attention = self.attention_kernel(torch)
        facts = {key: value for key, value in leader.facts.items() if key not in ("captured", "capture_s", "prepare_s", "prepared_ahead")}
        facts.update(compile_s=0.0, compiled_by="another toolchain's compilation of the same graph at this point")
        with out_of_memory_as_error(leader.batch_size, shape=leader.shape), attention():
            if getattr(self.spec, "capture", False) and leader.cuda:
                run, facts = self.captured_compiled(torch, leader.compiled, leader.examples, facts)
            else:
                run = compiled_run(torch, leader.compiled, leader.examples)
                self._first_run(torch, run)
        run = self._refusing_later(within(attention, run))
        return Prepared(
            engine_file,
            run,
            leader.examples,
            leader.device,
            leader.shape,
            facts,
            leader.model,
            leader.compiled,
            leader.compiled_at,
            tf32=self.spec.tf32,
        )

    def attention_kernel(self, torch):
        """A fresh context per call that restricts SDPA to the toolchain's kernel (a no-op context without one)."""

        if self.spec.sdpa_backend is None:
            return contextlib.nullcontext
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, SDPA_BACKENDS[self.spec.sdpa_backend])
        return lambda: sdpa_kernel([backend])

    def _first_run(self, torch, run: Callable[[], Any]):
        """``run()``, once, with the SDPA kernel PyTorch could not use turned into a refusal naming
        PyTorch's reasons (its warnings say why each kernel was passed over)."""
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with torch.no_grad():
                    return run()
            except RuntimeError as exc:
                refusal = self._attention_refusal(str(exc), [str(w.message) for w in caught])
                if refusal is None:
                    raise
                raise refusal from exc

    def _refusing_later(self, run: Callable[[], Any]) -> Callable[[], Any]:
        """``run``, with PyTorch refusing the toolchain's SDPA kernel at a later call a refusal too.
        A later call can see values the first run did not: on the H100 a BERT prepared at 2×16 on
        an unpadded batch ran the flash kernel, and the reference batch at the same point, padded,
        made PyTorch give up (`No available kernel`). The refusal is then this point's, recorded
        where it was found. PyTorch's reasons are warnings it gives once per place, so the run is
        repeated, recording them, only when it has failed."""
        if self.spec.sdpa_backend is None:
            return run

        def run_or_refuse():
            try:
                return run()
            except RuntimeError as exc:
                if self._attention_refusal(str(exc), []) is None:
                    raise
                refusal = self._attention_refusal(str(exc), _warnings_of(run))
                raise RefusedByTool(refusal.message, refusal.hint) from exc

        return run_or_refuse

    def _attention_refusal(self, error: str, warned: list[str]) -> NotPrepared | None:
        if self.spec.sdpa_backend is None or not any(words in error for words in ("No available kernel", "No viable backend")):
            return None
        because = "; ".join(dict.fromkeys(_kernel_reasons(warned, self.spec.sdpa_backend))) or error.strip().splitlines()[0]
        return NotPrepared(
            f"PyTorch cannot run scaled-dot-product attention with the {self.spec.sdpa_backend} kernel here: {because}",
            "choose another sdpa_backend for this dtype and GPU, or leave it unset for PyTorch to choose",
            {"sdpa_backend": self.spec.sdpa_backend, "error": error[:4000], "pytorch_warnings": warned[:20]},
        )

    def _compile(self, torch, compiled, examples: tuple):
        """Compile ``compiled`` (torch.compile's module) by running it once on ``examples``.

        Dynamo caches compiled code on the code object of forward(), which every model of one
        class shares (each timm ViT, each dtype and shape point of one transformer), guarded by the
        inputs' dtypes and shapes and the backend (the mode), not by the model instance. Several
        compiled models live in this process while a shape point is timed, so the cache is not
        reset before each: its recompile limit (past which Dynamo silently runs eagerly) is raised
        to the accumulated limit instead. A model another one's compilation served — same class,
        shapes and mode, so no graph was traced, and fullgraph and the graph facts untested — is
        compiled afresh after a reset; the others recompile when they next run, which the
        protocol's warm-up does before any take (pipeline/measuring/rounds.py)."""
        import torch._dynamo
        from torch._inductor.runtime import cache_dir_utils

        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, config.accumulated_recompile_limit)
        counters = torch._dynamo.utils.counters
        started = time.perf_counter()
        for fresh in (False, True):
            if fresh:
                torch._dynamo.reset()
            counters.clear()
            self._compile_once(torch, compiled, examples, started)
            if int(counters["stats"]["unique_graphs"]):
                break
        else:
            raise NotPrepared(
                "torch.compile compiled no graph: Dynamo ran the model eagerly (it skipped the frame)",
                "-v shows Dynamo's log; try the torch-eager toolchain",
                {"compile_s": round(time.perf_counter() - started, 3), "recompile_limit": config.recompile_limit},
            )
        facts = {
            "compile_s": round(time.perf_counter() - started, 3),
            "graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "graph_break_reasons": sorted(counters["graph_break"])[:20],
            "inductor_cache_dir": cache_dir_utils.cache_dir(),
            "inductor_cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
            # Part of the cache's key for a graph with CPU code (torch/_inductor/codecache.py,
            # cpp_runtime_thread_count): a graph compiled ahead under another count is not found.
            "threads": torch.get_num_threads(),
            "dynamic": self.spec.dynamic,
            "recompiles": 0,
            "compiled_after_a_reset": fresh,
        }
        return compiled_run(torch, compiled, examples), facts

    def _compile_once(self, torch, compiled, examples: tuple, started: float) -> None:
        # A mode that captures CUDA graphs skips the capture, with a warning, where it cannot hold
        # the model (a CPU tensor, an input it mutates, …) and runs it uncaptured: here that is an
        # error, so the point records a refusal with Inductor's reason instead of timing something else.
        graphs_captured = captures_graphs(self.spec) and examples[0].is_cuda
        strict = torch._inductor.config.patch({"triton.cudagraph_or_error": True}) if graphs_captured else contextlib.nullcontext()
        try:
            # Inductor prints its autotuning tables: shown with -v, like the export's tools.
            with self.reporter.captured("torch.compile"), strict:
                self._first_run(torch, lambda: compiled(*examples))
            if examples[0].is_cuda:
                torch.cuda.synchronize()
        except (torch.cuda.OutOfMemoryError, NotPrepared):
            raise
        except Exception as exc:  # Dynamo/Inductor raise many types: Unsupported, BackendCompilerFailed, …
            if fault_words(exc) is not None:
                raise  # a kernel faulted: the point's result (pipeline/running/faults.py), not the compiler's refusal
            ran_out = _out_of_memory_within(torch, exc)
            if ran_out is not None:  # Inductor's autotuning, say, wraps PyTorch's own: the point's result
                raise ran_out from exc
            text = str(exc).strip()
            refusal = self._attention_refusal(text, [])
            if refusal is not None:
                raise refusal from exc
            skipped = re.search(r"skipping cudagraphs due to (.+)", text)
            if skipped:
                raise NotPrepared(
                    f"torch.compile (mode {self.mode}) cannot capture the model in a CUDA graph: {skipped.group(1).strip().splitlines()[0]}",
                    "the model does what a capture cannot hold at this point; torch-compile without CUDA graphs runs it",
                    {"error": text[:4000], "compile_s": round(time.perf_counter() - started, 3)},
                ) from exc
            first = text.splitlines()[0] if text else type(exc).__name__
            fullgraph = self.spec.fullgraph and "graph break" in text.lower()
            raise NotPrepared(
                f"torch.compile failed: {first}",
                "the model breaks the graph and the toolchain has fullgraph = true; set it to false to run the pieces"
                if fullgraph
                else "run with -v for the compiler's traceback; try another mode, or the torch-eager toolchain",
                {"error": text[:4000], "error_type": type(exc).__name__, "compile_s": round(time.perf_counter() - started, 3)},
            ) from exc

    def captured_compiled(self, torch, compiled, examples: tuple, facts: dict[str, Any]):
        """torch.compile's module, compiled and run at these inputs, captured in one CUDA graph:
        its kernels, launched by one replay (``capture``). Also how a compiled point of a toolchain
        without ``capture`` is shared with one that has it (pytorch/compile_ahead.py)."""
        self.reporter.progress("capturing the compiled model in a CUDA graph")
        started = time.perf_counter()
        run = self._captured(torch, compiled, examples)
        return run, {**facts, "captured": "the compiled graph in one CUDA graph", "capture_s": round(time.perf_counter() - started, 3)}

    def _captured(self, torch, model, examples: tuple):
        """``model`` captured in a CUDA graph; a model the capture cannot hold (one that synchronises
        with the host, or branches on a value it computes) is a refusal with PyTorch's reason."""
        try:
            return capture(torch, model, examples)
        except RuntimeError as exc:
            if is_out_of_memory(type(exc), exc) or fault_words(exc) is not None or self._attention_refusal(str(exc), []) is not None:
                raise
            torch.cuda.synchronize()
            raise NotPrepared(
                f"the CUDA graph capture failed: {str(exc).strip().splitlines()[0]}",
                "the model does what a capture cannot hold (a host synchronisation, control flow on a computed value); "
                "torch-eager or torch-compile runs it",
                {"error": str(exc)[:4000]},
            ) from exc

    def _warm_compiled(self, torch, compiled, examples: tuple, compiled_facts: dict[str, Any]):
        """The dynamic compilation, run once at another shape point: whatever Dynamo compiles
        now (a guard the new shapes fail) is counted as recompilations, before any timing."""
        counters = torch._dynamo.utils.counters
        graphs_before = int(counters["stats"]["unique_graphs"])
        started = time.perf_counter()
        self._first_run(torch, lambda: compiled(*examples))
        if examples[0].is_cuda:
            torch.cuda.synchronize()
        recompiles = int(counters["stats"]["unique_graphs"]) - graphs_before
        facts = {
            **{
                key: compiled_facts[key]
                for key in ("compile_s", "graphs", "graph_breaks", "graph_break_reasons", "inductor_cache_dir", "dynamic")
            },
            "compiled_at_another_point": True,
            "warm_s": round(time.perf_counter() - started, 3),
            "recompiles": recompiles,
        }
        if recompiles:
            self.reporter.warn(f"torch.compile (dynamic) compiled {recompiles} more graph(s) for this shape point, before timing it")
        return compiled_run(torch, compiled, examples), facts

    # --- profile ------------------------------------------------------------------------------------


def _kernel_reasons(warned: list[str], kernel: str) -> list[str]:
    """PyTorch's reasons for passing over SDPA kernels, from its warnings, without what only
    restates the restriction of the toolchain to ``kernel``. Recorded on the H100 (torch 2.11),
    flash refusing a padded batch warns "Flash attention kernel not used because: (Triggered
    internally at …)", then "Flash Attention does not support non-null attn_mask. (Triggered
    internally at …)", and each other kernel "… has been runtime disabled.": the second alone
    says why."""
    reasons = []
    for warning in warned:
        line = re.sub(r"\s*\(Triggered internally at [^)]*\)\s*", " ", warning.strip().splitlines()[0] if warning.strip() else "").strip()
        if not ("kernel" in line.lower() or "attention" in line.lower()):
            continue
        if line.endswith("because:"):
            continue  # a heading of the reasons that follow
        if "has been runtime disabled" in line and kernel not in line.lower():
            continue  # a kernel the toolchain itself turned off
        reasons.append(line)
    return reasons


def _warnings_of(run: Callable[[], Any]) -> list[str]:
    """The warnings one more call of a run that failed gives (it fails again)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught, contextlib.suppress(RuntimeError):
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught]


def _out_of_memory_within(torch, exc: BaseException):
    """PyTorch's OutOfMemoryError that ``exc`` wraps (Dynamo and Inductor re-raise what failed inside
    them as their own errors), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
