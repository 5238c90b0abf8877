"""The exceptions a user can act on.

Anything raised as a :class:`PipelineError` is printed by the CLI as ``ERROR <message>`` and
``TIP <hint>`` without a traceback. Every other exception is a bug in this package and keeps its
traceback. The subclasses exist only to give scripts distinct exit codes.
"""

from __future__ import annotations


class PipelineError(Exception):
    """A failure the user can fix: bad input, a failed stage, a broken artefact."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def plain(self) -> PipelineError:
        """This error as its plain class from this module (which sets the exit code), message and
        hint only: what crosses a pipe from a child process, whatever else it carried."""
        cls = type(self) if type(self).__module__ == __name__ else PipelineError
        return cls(self.message, self.hint)


class UsageError(PipelineError):
    """The request itself is wrong: an unknown name, a forbidden option combination."""

    exit_code = 2


class EnvironmentMissing(PipelineError):
    """This machine lacks what the request needs: a GPU, Docker, an optional dependency."""

    exit_code = 3


class RefusedByTool(PipelineError):
    """An outside tool ran and refused the input: a compiler rejecting a network, say.

    Unlike a tool that could not run (no GPU, a crash, a timeout), a refusal is a fact about the
    input and the tool's release, so the stage records it in the manifest, with the tool's own
    reason and log, before the error reaches the user. ``outcome`` is what gets recorded.
    """

    def __init__(self, message: str, hint: str | None = None, *, result=None):
        super().__init__(message, hint)
        # What the tool left behind (its log, its parsed output), as the runtime reported it.
        self.result = result
        # Set by the stage: the StageOutcome it records as status "failed".
        self.outcome = None


class ToolCrashed(RefusedByTool):
    """An outside tool ended by a signal (a segmentation fault, an abort) without an error of its
    own. A build that crashed so is recorded as failed, with the signal (``signal``: its name); a
    cut of a graph whose build crashed says nothing of the failure reduced (pipeline reduce)."""

    def __init__(self, message: str, hint: str | None = None, *, result=None, signal: str = "a signal"):
        super().__init__(message, hint, result=result)
        self.signal = signal


class ToolStopped(PipelineError):
    """An outside tool that ran past its time limit, or was killed (SIGKILL: the out-of-memory
    killer, or someone stopping it): it gave no answer, which is no fact about its input. ``why``:
    which, in a few words ("ran past its time limit")."""

    def __init__(self, message: str, hint: str | None = None, *, why: str = "was stopped"):
        super().__init__(message, hint)
        self.why = why


class PointResult(RefusedByTool):
    """Work at a shape point that ended without a number but is a result all the same, recorded
    for that point with ``facts`` (the manifest's record of it) while the others go on."""

    def __init__(self, message: str, hint: str | None = None, *, result=None, facts: dict | None = None, entrant: str | None = None):
        super().__init__(message, hint, result=result)
        self.facts = dict(facts or {})
        # The engine of a point's rounds it happened to, where the rounds know it (pinned_to).
        self.entrant = entrant

    def pinned_to(self, entrant: str) -> PointResult:
        """This result, pinned to the engine of the point's rounds whose take or preparation raised it."""
        self.entrant = entrant
        return self

    def plain(self) -> PointResult:
        # Its facts cross a pipe too (a point measured in another process records them), and so
        # does the engine it was pinned to.
        return type(self)(self.message, self.hint, facts=self.facts, entrant=self.entrant)


class OutOfMemory(PointResult):
    """The work did not fit in the GPU's (or the host's) memory at this size: a result, not a
    failure — a fact about the model, the shape and the machine, recorded for that engine or shape
    point (status ``out_of_memory``). ``facts``: what ran out, as the manifest's
    ``OutOfMemoryFacts`` has it (memory, during, requested_bytes, free_bytes, total_bytes, gpu)."""


class DeviceFault(PointResult):
    """A kernel faulted on the GPU (a device-side assert, an illegal address, a launch failure, an
    uncorrectable ECC error): CUDA's context is unusable for the rest of the process, so the fault
    is recorded for the point and toolchain where it happened (status ``faulted``) and the process
    is replaced (pipeline/running/faults.py) so that the other points and toolchains go on. ``facts``:
    the error in CUDA's words and the call it was pinned to. ``done``: the stages the run had done
    when it faulted (what --force redid), which the fresh process does not do again."""

    def __init__(self, message: str, hint: str | None = None, *, result=None, facts: dict | None = None, entrant: str | None = None):
        super().__init__(message, hint, result=result, facts=facts, entrant=entrant)
        self.done: set = set()

    def after(self, done: set) -> DeviceFault:
        """This fault, with the stages the run had done before it."""
        self.done = set(done)
        return self


def tool_message(exc: BaseException) -> str:
    """An outside tool's error in its own words, every line of it on one line: ONNX Runtime, for
    one, puts what it found on the lines after the first ("index: 0 Got: 2 Expected: 1")."""
    lines = [" ".join(line.split()) for line in str(exc).splitlines()]
    return " ".join(line for line in lines if line) or type(exc).__name__


def require_module(module: str, *, purpose: str, extra: str | None = "export"):
    """Import a dependency or explain how to install it (``extra=None``: a core dependency)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        how = f"install the '{extra}' extra: pip install -e '.[{extra}]'" if extra else "reinstall the pipeline: pip install -e ."
        raise EnvironmentMissing(
            f"{purpose} needs the Python package '{module}', which is not importable ({exc}).",
            hint=f"{how} (or run `make setup`)",
        ) from exc
