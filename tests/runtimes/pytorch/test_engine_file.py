"""The torch toolchains' engine file: the same weights written again by this process become a
second name of the file already written, and anything else is written anew."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from pipeline.runtimes.pytorch import engine_file  # noqa: E402
from pipeline.runtimes.pytorch.engine_file import read_engine, write_engine  # noqa: E402


class _Spec:
    def model_dump(self, mode=None):
        return {"features": 4}


SOURCE = SimpleNamespace(name="m", family="python", spec=_Spec())
EXAMPLES = (torch.zeros(2, 4),)


def _module_around(weights: dict):
    """A module made again around the same tensors, as a build after the first makes it (cast_weights.adopt)."""
    module = torch.nn.Linear(4, 3)
    module.weight, module.bias = torch.nn.Parameter(weights["weight"]), torch.nn.Parameter(weights["bias"])
    return module


def test_the_same_weights_written_again_are_a_second_name_of_the_first_file(tmp_path):
    weights = {"weight": torch.randn(3, 4), "bias": torch.randn(3)}
    first, second = tmp_path / "torch-eager.pt", tmp_path / "torch-compile.pt"
    write_engine(first, SOURCE, "fp16", EXAMPLES, _module_around(weights))
    write_engine(second, SOURCE, "fp16", EXAMPLES, _module_around(weights))
    assert os.path.samefile(first, second)
    assert torch.equal(read_engine(second)["state_dict"]["weight"], weights["weight"])
    assert not list(tmp_path.glob("*.linking"))

    # Another precision's header is another file.
    other = tmp_path / "fp32.pt"
    write_engine(other, SOURCE, "fp32", EXAMPLES, _module_around(weights))
    assert not os.path.samefile(first, other) and read_engine(other)["precision"] == "fp32"


def test_builds_taking_the_precisions_in_turn_link_to_each_precisions_file(tmp_path):
    """The builds take each toolchain's variants in turn (bf16, fp16, bf16, ...): each precision's
    file is kept, so every build after a precision's first is a second name of that file; another
    model's weights let them go."""
    weights = {
        "bf16": {"weight": torch.randn(3, 4), "bias": torch.randn(3)},
        "fp16": {"weight": torch.randn(3, 4), "bias": torch.randn(3)},
    }
    files = {}
    for toolchain in ("torch-eager", "torch-eager-attn", "torch-cudagraphs"):
        for precision in ("bf16", "fp16"):
            path = tmp_path / f"{toolchain}-{precision}.pt"
            write_engine(path, SOURCE, precision, EXAMPLES, _module_around(weights[precision]))
            files.setdefault(precision, []).append(path)
    for precision, paths in files.items():
        assert all(os.path.samefile(paths[0], path) for path in paths[1:]), precision
        assert read_engine(paths[0])["precision"] == precision
    assert not os.path.samefile(files["bf16"][0], files["fp16"][0])
    other = SimpleNamespace(name="another", family="python", spec=_Spec())
    write_engine(tmp_path / "another.pt", other, "bf16", EXAMPLES, _module_around(weights["bf16"]))
    assert [written.header["source"]["name"] for written in engine_file._written] == ["another"]
    again = tmp_path / "again.pt"
    write_engine(again, SOURCE, "fp16", EXAMPLES, _module_around(weights["fp16"]))
    assert not os.path.samefile(files["fp16"][0], again)  # let go with the other model's write


def test_weights_written_in_place_since_are_written_anew(tmp_path):
    weights = {"weight": torch.randn(3, 4), "bias": torch.randn(3)}
    first, second = tmp_path / "a.pt", tmp_path / "b.pt"
    write_engine(first, SOURCE, "fp16", EXAMPLES, _module_around(weights))
    weights["bias"].add_(1.0)  # the same tensor, other values
    write_engine(second, SOURCE, "fp16", EXAMPLES, _module_around(weights))
    assert not os.path.samefile(first, second)
    assert torch.equal(read_engine(second)["state_dict"]["bias"], weights["bias"])
    assert not torch.equal(read_engine(first)["state_dict"]["bias"], weights["bias"])


def test_other_tensors_of_the_same_values_or_a_file_changed_since_are_written_anew(tmp_path):
    weights = {"weight": torch.randn(3, 4), "bias": torch.randn(3)}
    first, second, third = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    write_engine(first, SOURCE, "fp16", EXAMPLES, _module_around(weights))
    copies = {name: tensor.clone() for name, tensor in weights.items()}
    write_engine(second, SOURCE, "fp16", EXAMPLES, _module_around(copies))
    assert not os.path.samefile(first, second)  # equal values, but not what was written: not looked at
    # The file last written (second) replaced by another under its name: not linked to.
    replacement = tmp_path / "replacement.pt"
    replacement.write_bytes(b"not an engine")
    os.replace(replacement, second)
    write_engine(third, SOURCE, "fp16", EXAMPLES, _module_around(copies))
    assert not os.path.samefile(second, third) and read_engine(third)["format"] == engine_file.ENGINE_FORMAT
