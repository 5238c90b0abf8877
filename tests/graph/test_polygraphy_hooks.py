"""The private parts of Polygraphy that `pipeline reduce` and sanitize lean on, as the installed
release has them. pyproject.toml bounds Polygraphy to the minor release these pass on; a release
that moves one fails here, naming it, before a reduce quietly runs Polygraphy's own check (a shell
command) or its own inference instead of the product's."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def test_polygraphy_is_bounded_to_the_minor_release_installed():
    import polygraphy

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    pins = [d for d in tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["export"] if d.startswith("polygraphy")]
    assert len(pins) == 1
    bounds = re.fullmatch(r"polygraphy>=(\d+)\.(\d+),<(\d+)\.(\d+)", pins[0])
    assert bounds, f"{pins[0]}: Polygraphy needs an upper bound on its minor release (pipeline/graph/reduce.py patches private hooks)"
    low, high = (int(bounds[1]), int(bounds[2])), (int(bounds[3]), int(bounds[4]))
    installed = tuple(int(part) for part in polygraphy.__version__.split(".")[:2])
    assert low <= installed < high, f"Polygraphy {polygraphy.__version__} is installed, outside {pins[0]}"


def test_the_reducers_hooks_are_where_the_product_patches_them():
    from polygraphy.tools.args import OnnxInferShapesArgs
    from polygraphy.tools.debug.subtool.iterative_debug_args import CheckCmdArgs
    from polygraphy.tools.debug.subtool.reduce import Reduce

    tool = Reduce()
    args = tool.setup_parser().parse_args(["model.onnx", "-o", "out.onnx", "--mode", "bisect", "--no-onnxruntime-shape-inference"])
    tool.parse(args)
    assert CheckCmdArgs in tool.arg_groups, "Polygraphy's reduce no longer has CheckCmdArgs: pipeline/graph/reduce.py cannot give its check"
    assert OnnxInferShapesArgs in tool.arg_groups, "Polygraphy's reduce no longer has OnnxInferShapesArgs: the stand-ins cannot be given"
    run_check = inspect.signature(tool.arg_groups[CheckCmdArgs].run_check)
    assert list(run_check.parameters) == ["iter_artifact_path"], f"CheckCmdArgs.run_check{run_check} moved"
    fallback = inspect.signature(tool.arg_groups[OnnxInferShapesArgs].fallback_inference)
    assert list(fallback.parameters) == ["onnx_model", "outputs"], f"OnnxInferShapesArgs.fallback_inference{fallback} moved"
    # Both are called through the argument group's instance, whose attribute the product replaces.
    from polygraphy.tools.debug.subtool import iterative_debug_args, reduce

    assert "self.arg_groups[CheckCmdArgs].run_check(" in inspect.getsource(iterative_debug_args), "the reducer no longer calls run_check"
    assert ".fallback_inference(model, outputs=" in inspect.getsource(reduce), "the reducer no longer calls fallback_inference"


@pytest.mark.parametrize("name", ["error_ok", "allow_onnxruntime_shape_inference"])
def test_the_folding_loader_takes_what_sanitize_gives_it(name):
    from polygraphy.backend.onnx import fold_constants

    assert name in inspect.signature(fold_constants).parameters, f"polygraphy.backend.onnx.fold_constants has no {name} any more"
