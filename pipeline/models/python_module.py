"""A user's own PyTorch module: a factory function in a file of the workspace
(``python = "models-in/block.py:make"``) or in an installed module (``"package.module:make"``).

The factory is called with the model's catalog table (a dict: its ``config`` holds the factory's
own settings) after ``torch.manual_seed(seed)``, and returns the module and a description of its
inputs, in forward()'s order::

    return module, [
        {"name": "x", "shape": ["batch", "sequence", 256]},               # floats, the model's dtype
        {"name": "ids", "shape": ["batch", "sequence"], "dtype": "int64", "high": 32000},
        {"name": "mask", "shape": ["batch", "sequence"], "dtype": "int64", "kind": "attention_mask"},
    ]

A dimension is a size or the name of a dynamic axis; the catalog's ``shapes`` give the axes
sizes in the order they first appear (or the order ``axes`` lists). Floating inputs are drawn from
a seeded standard normal and take the precision of the variant; integer ones are drawn below
``high``; an input's ``make(shape, generator)`` replaces either. The factory may return a dict
instead of the pair, adding ``flops(sizes) -> float`` (the FLOPs of one forward at a point, for
the report's TFLOP/s). Everything else — export with dynamic axes, quantization of the Linear
layers, every toolchain, references and accuracy — is what a transformers model gets.

A factory file is pinned by its content (an installed module by its file's): a changed file is
taken again. What the factory does wrong is the user's to fix, and is said so: an ``ERROR``
naming the catalog key and the file with the factory's own words, exit status 2, before any work.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from pipeline.catalog import ModelSpec
from pipeline.models.base import MODEL_FLOAT, ModelInput, ModelSource, ShapePoint, attention_mask
from pipeline.running.errors import PipelineError, UsageError
from pipeline.running.user_code import digest, exited, import_file, said, where_in

# The dtypes an input may declare: "float" takes the variant's floating type (fp32, fp16, bf16).
INPUT_DTYPES = (MODEL_FLOAT, "int64", "int32")
INPUT_KINDS = ("values", "token_ids", "attention_mask")
DOCS = "docs/models.md, “Your own PyTorch module”"


class PythonSpec(ModelSpec):
    """A factory function that returns a PyTorch module and a description of its inputs."""

    python: str = Field(description='the factory: "models-in/block.py:make" (a file in the workspace) or "package.module:make"')
    # The factory's own settings; it is handed the whole table, this among it.
    config: dict[str, Any] = {}
    # The order of the dynamic axes in `shapes` ("2x512": batch, sequence); default: the order in
    # which they first appear among the inputs. Given, shape points are read without the factory.
    axes: tuple[str, ...] = ()
    # The name of the output in the ONNX graph and the manifests.
    output: str = "output"

    @field_validator("python")
    @classmethod
    def _factory(cls, text: str) -> str:
        where, _, function = text.rpartition(":")
        if not where or not function.isidentifier():
            raise ValueError(f'{text!r} names no factory: write "FILE.py:FUNCTION" or "package.module:FUNCTION"')
        return text

    def family(self) -> str:
        return "python"


@dataclass(frozen=True)
class Described:
    """What the factory says of its module, checked."""

    inputs: tuple[ModelInput, ...]
    # Per input, by name: the bound integer values are drawn below, and the user's own maker.
    high: dict[str, int]
    make: dict[str, Callable]
    flops: Callable | None


# Process-wide: (factory reference, content, table) → its description, so that asking for the
# shape points does not build the module each time a stage looks at the model.
_DESCRIPTIONS: dict[tuple[str, str, str], Described] = {}


class PythonModel(ModelSource):
    """A PyTorch module made by the user's factory."""

    family = "python"
    Spec = PythonSpec
    exporter = "dynamo"
    # ModelOpt's preset quantizes every layer it knows; a user's block is quantized where it has
    # Linear layers, as transformers are.
    quantize_linear_only = True

    def weights_words(self) -> str:
        return f"the factory's (torch seeded {self.spec.seed})"

    def describe(self) -> str:
        return f"PyTorch module from {self.spec.python}"

    def facts(self) -> dict[str, Any]:
        return {"python": self.spec.python, "config": dict(sorted(self.spec.config.items())), "axes": list(self.dynamic_axes())}

    # --- the factory ----------------------------------------------------------------------------

    def _where(self) -> tuple[str, str]:
        where, _, function = self.spec.python.rpartition(":")
        return where, function

    def _is_file(self) -> bool:
        where, _ = self._where()
        return where.endswith(".py") or "/" in where or "\\" in where

    def factory_file(self) -> Path:
        """The file the factory is defined in (an installed module's own file)."""
        where, _ = self._where()
        if self._is_file():
            path = self.in_workspace(Path(where))
            if not path.is_file():
                raise self._error(f"the factory's file {path} does not exist", 'fix `python` in pipeline.toml ("FILE.py:FUNCTION")')
            return path
        try:
            found = importlib.util.find_spec(where)
        except Exception as exc:  # finding a submodule imports its packages, which may raise anything
            found, reason = None, said(exc)
        else:
            reason = "no module by that name is installed"
        if found is None or not found.origin or not Path(found.origin).is_file():
            raise self._error(
                f"cannot import {where!r}: {reason}", 'install the package, or name a file: python = "models-in/FILE.py:FUNCTION"'
            )
        return Path(found.origin)

    def input_files(self) -> list[Path]:
        return [self.factory_file()]

    def _error(self, what: str, hint: str = f"see {DOCS}") -> UsageError:
        return UsageError(f"model {self.name!r} (python = {self.spec.python!r}): {what}", hint=hint)

    def _exited(self, what: str, exc: SystemExit, hint: str) -> UsageError:
        """The user's code ending the process (sys.exit), which would end the pipeline without a word."""
        return self._error(exited(what, exc, self.factory_file()), hint)

    def _factory(self) -> Callable:
        path = self.factory_file()
        where, function = self._where()
        if self._is_file():
            module = import_file(path, self._error)
        else:
            try:
                module = importlib.import_module(where)
            except SystemExit as exc:
                raise self._exited(f"importing {where}", exc, f"remove the exit from {path.name}'s top level") from None
            except Exception as exc:
                raise self._error(f"importing {where} failed: {said(exc)}", f"fix {path} so that it imports") from None
        factory = getattr(module, function, None)
        if not callable(factory):
            defined = sorted(name for name, value in vars(module).items() if inspect.isfunction(value) and not name.startswith("_"))
            raise self._error(
                f"{path} defines no function {function!r}",
                f"its functions: {', '.join(defined)}" if defined else "define the factory there: def make(table): return module, inputs",
            )
        return factory

    def _call_factory(self) -> tuple[Any, Described]:
        """(module in eval mode, FP32, on the CPU; its description), the factory called with the seed set."""
        import torch

        factory = self._factory()
        torch.manual_seed(self.spec.seed)
        try:
            made = factory(self.spec.model_dump(mode="json"))
        except SystemExit as exc:
            raise self._exited("the factory", exc, "return the module and its inputs instead of exiting") from None
        except Exception as exc:
            raise self._error(f"the factory raised {said(exc)}{where_in(exc, self.factory_file())}", "fix the factory") from None
        if isinstance(made, dict):
            module, inputs, flops = made.get("module"), made.get("inputs"), made.get("flops")
        elif isinstance(made, (tuple, list)) and len(made) == 2:
            (module, inputs), flops = made, None
        else:
            raise self._error(
                f"the factory returned {_kind(made)}; it returns (module, inputs) or a dict with 'module' and 'inputs'",
                f"end the factory with `return module, inputs` ({DOCS})",
            )
        if not isinstance(module, torch.nn.Module):
            raise self._error(
                f"the factory returned {_kind(module)} as its module; it must be a torch.nn.Module",
                f"return the module itself, then the description of its inputs ({DOCS})",
            )
        if flops is not None and not callable(flops):
            raise self._error(f"'flops' is {_kind(flops)}; it is a function of the axes' sizes (a dict) to a number")
        described = self._check_description(inputs, flops)
        return module.float().eval(), described

    def _check_description(self, inputs, flops) -> Described:
        if not isinstance(inputs, (list, tuple)) or not inputs:
            raise self._error(f"the inputs are {_kind(inputs)}; describe them as a list with a dict per input, in forward()'s order")
        described, high, make = [], {}, {}
        for position, entry in enumerate(inputs, 1):
            what = f"input {position} of the description"
            if not isinstance(entry, dict):
                raise self._error(f"{what} is {_kind(entry)}, not a dict with 'name' and 'shape'")
            unknown = sorted(set(entry) - {"name", "shape", "dtype", "kind", "high", "make"})
            if unknown:
                raise self._error(
                    f"{what} has key(s) {', '.join(map(repr, unknown))}; an input has name, shape, dtype, kind, high and make"
                )
            name = entry.get("name")
            if not isinstance(name, str) or not name.isidentifier():
                raise self._error(f"{what} has the name {name!r}; give each input a name (a Python identifier)")
            if name in (i.name for i in described):
                raise self._error(f"two inputs are named {name!r}")
            shape = entry.get("shape")
            if not isinstance(shape, (list, tuple)) or not all(
                (isinstance(d, int) and not isinstance(d, bool) and d > 0) or (isinstance(d, str) and d.isidentifier()) for d in shape
            ):
                raise self._error(f'input {name!r} has the shape {shape!r}; a shape lists sizes and axis names, e.g. ["batch", 128]')
            dtype = entry.get("dtype", MODEL_FLOAT)
            if dtype not in INPUT_DTYPES:
                raise self._error(
                    f"input {name!r} has the dtype {dtype!r}; the pipeline feeds {', '.join(map(repr, INPUT_DTYPES))}",
                    '"float" is the floating type of the variant (fp32, fp16 or bf16)',
                )
            integer = dtype != MODEL_FLOAT
            kind = entry.get("kind", "token_ids" if integer else "values")
            if kind not in INPUT_KINDS or (kind == "values") == integer:
                raise self._error(
                    f"input {name!r} ({dtype}) has the kind {kind!r}; floats are 'values', integers 'token_ids' or 'attention_mask'"
                )
            if entry.get("make") is not None:
                if not callable(entry["make"]):
                    raise self._error(f"input {name!r}: 'make' is {_kind(entry['make'])}; it is a function (shape, generator) → tensor")
                make[name] = entry["make"]
            elif kind == "token_ids":
                bound = entry.get("high")
                if not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
                    raise self._error(
                        f"integer input {name!r} has no bound to draw below ('high': {bound!r})",
                        "give 'high' (e.g. the vocabulary size), or 'make' to make its values yourself",
                    )
                high[name] = bound
            described.append(ModelInput(name, tuple(shape), dtype, kind))
        found = list(dict.fromkeys(d for i in described for d in i.dims if isinstance(d, str)))
        if self.spec.axes and sorted(self.spec.axes) != sorted(found):
            raise self._error(
                f"axes {list(self.spec.axes)} contradict the inputs' dynamic axes {found}",
                "list each of the inputs' axis names once in `axes`, or remove it",
            )
        return Described(tuple(described), high, make, flops)

    def description(self) -> Described:
        """The factory's description, from this process's cache when the factory file, its table and
        the module are unchanged (the factory is called once for it)."""
        key = self._cache_key()
        if key not in _DESCRIPTIONS:
            _, _DESCRIPTIONS[key] = self._call_factory()
        return _DESCRIPTIONS[key]

    def _cache_key(self) -> tuple[str, str, str]:
        content = digest(self.factory_file())
        return self.spec.python, content, json.dumps(self.spec.model_dump(mode="json"), sort_keys=True)

    # --- the model ------------------------------------------------------------------------------

    def create(self):
        module, described = self._call_factory()
        _DESCRIPTIONS[self._cache_key()] = described
        return module

    def runnable(self, model):
        return _first_tensor(model, self.spec.output, tuple(i.name for i in self.inputs()), self._error).eval()

    def inputs(self, model=None) -> list[ModelInput]:
        return list(self.description().inputs)

    def output_name(self) -> str:
        return self.spec.output

    def dynamic_axes(self) -> tuple[str, ...]:
        if self.spec.axes:
            return self.spec.axes
        return tuple(dict.fromkeys(d for i in self.inputs() for d in i.dims if isinstance(d, str)))

    def shape_points(self) -> list[ShapePoint]:
        axes = self.dynamic_axes()
        if axes and not self.spec.shapes:
            raise self._error(
                f"the module's inputs have the dynamic axes {' × '.join(axes)}, and `shapes` gives them no sizes",
                'list the points, e.g. shapes = ["2x128"]',
            )
        if self.spec.shapes and not axes:
            raise self._error(
                "the module's inputs have no dynamic axes, so `shapes` cannot size any", "remove `shapes`, or name an axis in a shape"
            )
        return super().shape_points()

    def flops(self, point: ShapePoint | None) -> float | None:
        """The FLOPs of one forward at ``point``, as the factory counts them; None where it does not."""
        count = self.description().flops
        if count is None or point is None:
            return None
        try:
            return float(count(point.as_dict()))
        except Exception as exc:
            raise self._error(f"flops({point.as_dict()}) raised {said(exc)}", "fix the factory's flops function") from None

    def sample_inputs(self, model, point: ShapePoint | None, seed: int) -> tuple:
        """Floats from a seeded standard normal, integers below their bound, attention masks of
        ones, or what each input's ``make`` returns; all seeded by ``seed``."""
        import torch

        described = self.description()
        generator = torch.Generator().manual_seed(seed)
        tensors = []
        for spec in described.inputs:
            if point is None and any(isinstance(d, str) for d in spec.dims):
                raise PipelineError(f"model {self.name!r} has no shape points.", hint='list them in pipeline.toml, e.g. shapes = ["2x128"]')
            shape = spec.shape_at(point) if point is not None else tuple(spec.dims)
            if spec.name in described.make:
                try:
                    tensor = described.make[spec.name](shape, generator)
                except Exception as exc:
                    raise self._error(f"make() of input {spec.name!r} raised {said(exc)}", "fix the input's make function") from None
                if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
                    got = list(tensor.shape) if isinstance(tensor, torch.Tensor) else _kind(tensor)
                    raise self._error(f"make() of input {spec.name!r} returned {got} at {point}; the shape there is {list(shape)}")
                tensor = tensor.float() if spec.dtype == MODEL_FLOAT else tensor.to(getattr(torch, spec.dtype))
            elif spec.kind == "values":
                tensor = torch.randn(shape, generator=generator)
            elif spec.kind == "attention_mask":
                tensor = attention_mask(shape, getattr(torch, spec.dtype), generator, padding=False)
            else:
                tensor = torch.randint(0, described.high[spec.name], shape, generator=generator, dtype=getattr(torch, spec.dtype))
            tensors.append(tensor)
        return tuple(tensors)

    def input_refused(self, exc: BaseException, shape, model) -> PipelineError:
        """The module's forward failing on the inputs its description gives: the description does
        not match what the module takes."""
        return self._error(
            f"its forward failed on the inputs the factory describes ({self._shapes_text()}, the first {'×'.join(map(str, shape))}): "
            f"{said(exc)}"
            f"{where_in(exc, self.factory_file())}",
            "make the description's names, order, shapes and dtypes those the module's forward() takes",
        )

    def _shapes_text(self) -> str:
        return ", ".join(f"{i.name} {list(i.dims)}" for i in self.inputs())


def _kind(value) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _first_tensor(module, output: str, names: tuple[str, ...], error: Callable[[str, str], UsageError]):
    """``module`` returning one tensor: its output, the first tensor of a tuple, or the entry of a
    dict named after the catalog's `output` (else its first tensor). Anything else it returns, and
    a sys.exit() in its forward, is the user's ``error``. The wrapper's forward() names its
    parameters after the inputs, as the module's own does: torch.export matches the dynamic axes to
    them by name."""
    import torch

    def forward(self, *inputs):
        try:
            result = self.module(*inputs)
        except SystemExit as exc:
            raise error(f"its forward called sys.exit({exc.code!r})", "return the output instead of exiting") from None
        if isinstance(result, torch.Tensor):
            return result
        if isinstance(result, dict) and isinstance(result.get(self.output), torch.Tensor):
            return result[self.output]
        held = result.values() if isinstance(result, dict) else result if isinstance(result, (tuple, list)) else ()
        tensor = next((value for value in held if isinstance(value, torch.Tensor)), None)
        if tensor is None:
            raise error(
                f"its forward returned {_returned(result)}; the pipeline measures a tensor, or a tuple or dict holding one",
                f"return the output tensor (a dict's entry named by `output = {self.output!r}` is taken first) ({DOCS})",
            )
        return tensor

    parameter = inspect.Parameter
    forward.__signature__ = inspect.Signature([parameter(name, parameter.POSITIONAL_OR_KEYWORD) for name in ("self", *names)])
    wrapper = type("FirstTensor", (torch.nn.Module,), {"forward": forward})()
    wrapper.module, wrapper.output = module, output
    return wrapper


def _returned(value) -> str:
    """What a forward returned, in a few words: "None", "a list of 2 str ('a', 'b')", "a dict with
    keys 'logits' (a str)"."""
    if value is None:
        return "None"
    if isinstance(value, dict):
        entries = ", ".join(f"{key!r} ({_kind(item)})" for key, item in list(value.items())[:4])
        return f"a dict with no tensor (keys {entries}{', …' if len(value) > 4 else ''})" if value else "an empty dict"
    if isinstance(value, (tuple, list)):
        if not value:
            return f"an empty {type(value).__name__}"
        kinds = ", ".join(dict.fromkeys(type(item).__name__ for item in value))
        shown = reprlib.repr(value)
        return f"a {type(value).__name__} of {len(value)} {kinds} and no tensor: {shown}"
    return f"{_kind(value)}: {reprlib.repr(value)}"
