"""Bad input on the paths of transformers catalogs, user ONNX files, shape strings, shape-point
manifests and `pipeline diff`: each case as a user meets it, from the command line.

Every case is an `ERROR` with a `TIP`, the exit status docs/models.md or docs/diff.md give, no
traceback, and nothing written to the workspace (its lock file aside). The last test checks that
every line of those docs' "Bad input" sections has a case here.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, SAMPLES, write_catalog
from tests.models.test_transformers import BERT_CATALOG, SHAPES

pytest.importorskip("transformers", reason="the transformers family needs the transformers package (`make setup` installs it)")

LOCK = Path("manifests") / ".workspace.lock"


def user_graph(path: Path, dims=("batch", "sequence"), elem: str = "INT64") -> None:
    """A small ONNX graph of the kind a user brings: token ids through an embedding table."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    ids = helper.make_tensor_value_info("input_ids", getattr(TensorProto, elem), list(dims))
    hidden = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [*dims, 8])
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((200, 8)).astype("float32"), "embeddings")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embeddings", "input_ids"], ["hidden"], name="lookup")], "user", [ids], [hidden], [table]
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


USER_MODEL = """
[models.mine]
onnx = "user.onnx"
shapes = ["2x8", "4x32"]
"""


def files_of(ws: Path) -> dict[str, bytes]:
    return {str(p.relative_to(ws)): p.read_bytes() for p in sorted(ws.rglob("*")) if p.is_file() and p.relative_to(ws) != LOCK}


@dataclass
class Case:
    id: str
    doc: str  # the words of the docs' "Bad input" line this case checks
    # (the case's workspace, the measured one) → (catalog, command arguments)
    setup: Callable[[Path, Path], tuple[Path, list[str]]]
    exit: int
    message: str
    tip: str


# --- setups ------------------------------------------------------------------------------------------


def bert(old: str = "", new: str = "", *args: str, extra: str = "", files: Callable[[Path], None] | None = None):
    """The 2-layer BERT catalog with one edit, files beside it, and the command to run."""

    def setup(ws: Path, measured: Path):
        assert old in BERT_CATALOG
        catalog = write_catalog(ws, BERT_CATALOG.replace(old, new, 1) + extra)
        if files:
            files(ws)
        return catalog, list(args) or ["export", "--engine", "bert_fp32"]

    return setup


def folder(config: str | None):
    def make(ws: Path):
        (ws / "my-bert").mkdir()
        if config is not None:
            (ws / "my-bert" / "config.json").write_text(config)

    return make


def tokens(array=None, text: str | None = None):
    def make(ws: Path):
        import numpy as np

        if text is not None:
            (ws / "tokens.npy").write_text(text)
        elif array is not None:
            np.save(ws / "tokens.npy", np.asarray(array))

    return make


def user(edit: Callable[[Path], None] | None = None, catalog_edit: tuple[str, str] = ("", ""), reference: Callable | None = None, **graph):
    """A user's ONNX model `mine` (the graph of user_graph with **graph), then ``edit`` of the file."""

    def setup(ws: Path, measured: Path):
        text = (BERT_CATALOG + USER_MODEL).replace(*catalog_edit, 1)
        catalog = write_catalog(ws, text + ('reference = "ref"\n' if reference else ""))
        user_graph(ws / "user.onnx", **graph)
        if edit:
            edit(ws / "user.onnx")
        if reference:
            (ws / "ref").mkdir()
            reference(ws / "ref")
        return catalog, ["export", "--engine", "mine_fp32"]

    return setup


def data_file_gone(path: Path) -> None:
    """The graph saved with its weights in an external data file, which is then removed."""
    import onnx

    model = onnx.load(str(path))
    onnx.save(model, str(path), save_as_external_data=True, location="user.weights", size_threshold=0)
    (path.parent / "user.weights").unlink()


def cut_short(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def without_outputs(path: Path) -> None:
    import onnx

    model = onnx.load(str(path))
    del model.graph.output[:]
    path.write_bytes(model.SerializeToString())


def checker_refuses(path: Path) -> None:
    import onnx

    model = onnx.load(str(path))
    model.graph.node[0].input[0] = "no_such_tensor"  # a node reading what nothing produces
    onnx.save(model, str(path))


def shapes_disagree(path: Path) -> None:
    """The embedding projected by a weight whose rows are not the embedding's width."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    model.graph.node[0].output[0] = "embedded"
    model.graph.initializer.append(numpy_helper.from_array(np.ones((5, 8), "float32"), "projection"))
    model.graph.node.append(helper.make_node("MatMul", ["embedded", "projection"], ["hidden"], name="project"))
    onnx.save(model, str(path))


def npz(point: str = "2x8", **arrays):
    def make(folder: Path):
        import numpy as np

        np.savez(folder / f"{point}.npz", **{name: np.asarray(value) for name, value in arrays.items()})

    return make


def measured_copy(edit: Callable[[Path], None] | None, *args: str):
    """A copy of the measured workspace (bert and mine fp32 on ONNX Runtime), ``edit`` applied;
    "{ws}" in an argument is the copy's path."""

    def setup(ws: Path, measured: Path):
        shutil.copytree(measured, ws)
        if edit:
            edit(ws)
        return ws / "pipeline.toml", [arg.format(ws=ws) for arg in args]

    return setup


def point_manifest(ws: Path, point: str = "2x8") -> Path:
    return ws / "manifests" / "onnxruntime" / f"bert_fp32@{point}.json"


def set_shape(value: str, point: str = "2x8"):
    def edit(ws: Path):
        path = point_manifest(ws, point)
        data = json.loads(path.read_text())
        data["shape"] = value
        path.write_text(json.dumps(data))

    return edit


def layer_json(ws: Path) -> None:
    (ws / "other.json").write_text(
        json.dumps({"Layers": [{"Name": "embeddings_gather", "LayerType": "Gather", "Metadata": "[ONNX Layer: /embeddings/Gather]"}]})
    )


def times_only(ws: Path) -> None:
    (ws / "times").mkdir()
    shutil.copy(SAMPLES / "trt10.4.0_rtx3060laptop_exportTimes_alexnet_HEAD11LINES.json.txt", ws / "times" / "times.json")


def python_model(source: str | None, factory: str = "block.py:make", variant: str = "fp32"):
    """A user's PyTorch module `block`: ``source`` as block.py in the workspace (None: no file),
    exported as ``variant``."""

    def setup(ws: Path, measured: Path):
        text = BERT_CATALOG + f'\n[models.block]\npython = "{factory}"\nshapes = ["2x8", "4x32"]\n'
        catalog = write_catalog(ws, text)
        if source is not None:
            (ws / "block.py").write_text(textwrap.dedent(source))
        return catalog, ["export", "--engine", f"block_{variant}"]

    return setup


LINEAR = """
import torch

def make(table):
    return torch.nn.Linear(8, 8), [{"name": "x", "shape": ["batch", "sequence", 8]}]
"""


def factory_returning(value: str, inputs: str = '[{"name": "x", "shape": ["batch", "sequence", 8]}]') -> str:
    return f"import torch\n\ndef make(table):\n    return {value}, {inputs}\n"


def forward_returning(value: str) -> str:
    """A factory file whose module's forward runs a Linear layer, then returns ``value``."""
    return textwrap.dedent(f"""
        import torch

        class Odd(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(8, 8)

            def forward(self, x):
                self.linear(x)
                return {value}

        def make(table):
            return Odd(), [{{"name": "x", "shape": ["batch", "sequence", 8]}}]
        """)


LAYERS_110 = str(SAMPLES / "trt11.0.0_b200_exportLayerInfo_detailed.json")
DRY_RUN = ("build", "--engine", "bert_fp16", "--trt", "10.14", "--dry-run")


def with_tokens(files=None):
    """bert calibrating INT8 on `calibration_tokens = "tokens.npy"`, made by ``files``."""
    return bert(SHAPES, SHAPES + '\ncalibration_tokens = "tokens.npy"', "export", "--engine", "bert_int8", files=files)


def with_folder(config: str | None):
    """bert read from the folder my-bert, holding ``config`` as its config.json (None: nothing)."""
    return bert('transformers = "BertModel"', 'transformers = "BertModel"\npath = "my-bert"', files=folder(config))


CASES = [
    # Transformers catalogs.
    Case("unknown-class", "an unknown transformers class", bert('"BertModel"', '"BertModle"'), 2,
         "has no model class 'BertModle'", "did you mean 'BertModel'"),
    Case("unknown-config-key", "an unknown `config` key", bert("hidden_size = 32,", "hiden_size = 32,"), 2,
         "BertConfig has no key(s) 'hiden_size'", "'hiden_size' → 'hidden_size'"),
    Case("config-refused", "a `config` the model class refuses", bert("vocab_size = 512,", "vocab_size = 512, pad_token_id = 600,"), 1,
         "transformers could not create BertModel for model 'bert': Padding_idx must be within num_embeddings",
         "check the model's config overrides in pipeline.toml"),
    Case("no-shapes", "a model without `shapes`", bert(SHAPES, ""), 2,
         "models.bert: a transformers model is measured at shape points", "see the comments in pipeline.toml"),
    Case("sequence-too-long", "a sequence longer than", bert(SHAPES, 'shapes = ["2x8", "3x100"]'), 2,
         "longer than the model's max_position_embeddings (64)", "at most 64"),
    Case("sequence-too-long-dry-run", "a sequence longer than", bert(SHAPES, 'shapes = ["2x8", "3x100"]', *DRY_RUN), 2,
         "longer than the model's max_position_embeddings (64)", "at most 64"),
    Case("folder-without-config", "a `path` folder without `config.json`",
         with_folder(None), 2,
         "has no config.json", "save_pretrained()"),
    Case("config-not-json", "a `config.json` that is not JSON",
         with_folder("{ not json"), 2,
         "config.json is not readable JSON", "save the folder again"),
    Case("remote-code", "remote code (`auto_map`)",
         with_folder(json.dumps({"model_type": "bert", "auto_map": {"AutoModel": "modeling_evil.EvilModel"}})), 2,
         "running a model repository's code (trust_remote_code) is refused", "a model class that transformers itself provides"),
    Case("calibration-images", "a calibration folder of images for a transformer",
         bert("", "", "export", "--engine", "bert_int8", "--calib-dir", "images", files=lambda ws: (ws / "images").mkdir()), 2,
         "calibrates on seeded inputs of its own", "leave out --calib-dir"),
    Case("tokens-missing", "`calibration_tokens` that do not exist",
         with_tokens(), 2,
         "calibration_tokens file", "fix `calibration_tokens`"),
    Case("tokens-not-npy", "are not a `.npy` array",
         with_tokens(tokens(text="1 2 3")), 2,
         "is not a .npy array", "numpy.save"),
    Case("tokens-wrong-rank", "are not a 2-D integer array",
         with_tokens(tokens(list(range(16)))), 2,
         "array of shape [16]; token ids are integers, one sequence per row", "save a 2-D integer array"),
    Case("tokens-not-integers", "are not a 2-D integer array",
         with_tokens(tokens([[0.5] * 16] * 2)), 2,
         "holds a float64 array of shape [2, 16]", "save a 2-D integer array"),
    Case("tokens-outside-vocabulary", "hold a token id outside the vocabulary",
         with_tokens(tokens([[1] * 15 + [512]] * 3)), 2,
         "token id 512 at row 0, position 15 of", "tokenize with the model's own tokenizer"),
    Case("tokens-too-long", "hold sequences longer than the model",
         with_tokens(tokens([[1] * 100] * 2)), 2,
         "are 100 long; the model takes at most 64", "cut the sequences to at most 64"),
    # Shape strings.
    Case("opset-too-high", "an `opset` above the highest", bert("opset = 17", "opset = 99"), 2,
         "opset = 99 (pipeline.toml): torch", "set `opset` in pipeline.toml to at most"),
    Case("opset-too-high-quantized", "an `opset` above the highest", bert("opset = 17", "opset = 99", "export", "--engine", "bert_int8"), 2,
         "ONNX exporter (TorchScript) writes opsets up to", "set `opset` in pipeline.toml to at most"),
    Case("shape-not-a-shape", "a shape that is not sizes joined by `x`", bert(SHAPES, 'shapes = ["2by16"]'), 2,
         "models.bert.shapes: '2by16' is not a shape", "see the comments in pipeline.toml"),
    Case("shape-wrong-sizes", "a shape with the wrong number of sizes", bert(SHAPES, 'shapes = ["2x8x4"]'), 2,
         "has 3 size(s), but the model's dynamic axes are batch × sequence", "one size per axis"),
    Case("shape-wrong-sizes-dry-run", "a shape with the wrong number of sizes", bert(SHAPES, 'shapes = ["2x8x4"]', *DRY_RUN), 2,
         "has 3 size(s), but the model's dynamic axes are batch × sequence", "one size per axis"),
    Case("outside-range", "a point outside `shape_range`",
         bert(SHAPES, SHAPES + '\nshape_range = { min = "1x8", opt = "2x8", max = "2x16" }'), 2,
         "lie outside the engines' shape_range", "widen shape_range"),
    Case("range-not-ordered", "whose min, opt and max are not in order",
         bert(SHAPES, SHAPES + '\nshape_range = { min = "1x8", opt = "2x32", max = "4x24" }', *DRY_RUN), 2,
         "shape_range 1x8 / 2x32 / 4x24 is not ordered in sequence", "min ≤ opt ≤ max"),
    # A user's ONNX file.
    Case("onnx-missing", "a file that does not exist", user(edit=lambda path: path.unlink()), 2,
         "user.onnx does not exist", "fix `onnx`"),
    Case("onnx-empty", "is empty", user(edit=lambda path: path.write_bytes(b"")), 2,
         "user.onnx is empty (0 bytes)", "point `onnx` of models.mine"),
    Case("onnx-empty-without-shapes", "the same error", user(edit=lambda path: path.write_bytes(b""), catalog_edit=('shapes = ["2x8", "4x32"]\n', "")), 2,
         "user.onnx is empty (0 bytes)", "point `onnx` of models.mine"),
    Case("onnx-random-bytes", "does not decode as ONNX", user(edit=lambda path: path.write_bytes(bytes(range(256)) * 8)), 2,
         "is not an ONNX file, or one cut short", "export the model to ONNX again"),
    Case("onnx-cut-short", "or is cut short", user(edit=cut_short), 2,
         "is not an ONNX file, or one cut short", "export the model to ONNX again"),
    Case("onnx-cut-at-a-field", "or is cut short", user(edit=without_outputs), 2,
         "is no whole ONNX model: it has no graph output", "export the model to ONNX again"),
    Case("onnx-checker", "a graph the ONNX checker refuses", user(edit=checker_refuses), 2,
         'user.onnx cannot be read as ONNX at node "lookup" (Gather): Nodes in a graph must be topologically sorted',
         "onnx.checker.check_model('FILE', full_check=True)"),
    Case("onnx-shapes-disagree", "or whose shapes disagree at a node", user(edit=shapes_disagree), 2,
         'user.onnx cannot be read as ONNX at node "project" (MatMul): Incompatible dimensions for matrix multiplication',
         "no compiler reads a graph ONNX's own checker refuses"),
    Case("onnx-external-data-missing", "an external data file the graph names that is not beside it", user(edit=data_file_gone), 2,
         "keeps its weights in external data file(s) user.weights, which are not beside it", "keep the data files where the model was saved"),
    Case("onnx-unnamed-dims", "dynamic dimensions without a name", user(dims=("batch", None)), 2,
         "have dimensions without a size or a name", "export the graph with named dynamic axes"),
    Case("onnx-axes-not-sized", "axes the catalog does not size", user(catalog_edit=('shapes = ["2x8", "4x32"]\n', "")), 2,
         "gives no shape for the graph's dynamic axes batch × sequence (its inputs: input_ids [batch, sequence])", "list the points"),
    Case("onnx-axes-contradict", "`axes` that contradict the graph",
         user(catalog_edit=('onnx = "user.onnx"', 'onnx = "user.onnx"\naxes = ["batch", "tokens"]')), 2,
         "axes ['batch', 'tokens'] contradict the graph", "list each of the graph's dynamic axes once"),
    Case("onnx-static-with-shapes", "or `shapes` for a graph without dynamic axes", user(dims=(2, 8)), 2,
         "has no dynamic axes, so `shapes` cannot size any", "remove `shapes`"),
    Case("onnx-input-type", "an input of a type the pipeline does not feed", user(elem="UINT8"), 2,
         "has ONNX element type 2, which the pipeline does not feed", "give the graph inputs of float32"),
    Case("reference-missing", "a `reference` folder without a point's `.npz`", user(reference=npz("2x8", input_ids=[[1] * 8] * 2)), 2,
         "has no 4x32.npz", "save one .npz per shape point"),
    Case("reference-unreadable", "an `.npz` that is not readable",
         user(reference=lambda folder: [(folder / f"{p}.npz").write_text("no") for p in ("2x8", "4x32")]), 2,
         "is not a readable .npz file", "numpy.savez"),
    Case("reference-lacks-array", "lacks an array the graph names",
         user(reference=lambda folder: [npz(p, input_ids=[[1] * 8] * 2)(folder) for p in ("2x8", "4x32")]), 2,
         "has no array(s) 'hidden'", "name the arrays after the graph's inputs"),
    Case("reference-wrong-shape", "an input of another shape than the point's",
         user(reference=lambda folder: [npz(p, input_ids=[[1] * 8] * 3, hidden=[0.0])(folder) for p in ("2x8", "4x32")]), 2,
         "'input_ids' in", "save the inputs of 2x8.npz at the sizes of shape point 2x8"),
    # A user's PyTorch module.
    Case("python-no-file", "a factory file that does not exist", python_model(None), 2,
         "(python = 'block.py:make'): the factory's file", "fix `python` in pipeline.toml"),
    Case("python-no-module", "an installed module that does not import", python_model(None, "no_such_package.models:make"), 2,
         "cannot import 'no_such_package.models'", "install the package, or name a file"),
    Case("python-syntax", "a file with a syntax error", python_model("def make(table)\n    return 1\n"), 2,
         "block.py does not parse: expected ':' (line 1)", "fix the syntax error in block.py"),
    Case("python-import-fails", "a file that raises when imported", python_model("import no_such_module_here\n"), 2,
         "importing", "fix block.py so that it imports"),
    Case("python-import-exits", "a file that calls `sys.exit()` when imported", python_model("import sys\nsys.exit(3)\n"), 2,
         "block.py called sys.exit(3) (block.py, line 2)", "remove the exit from block.py's top level"),
    Case("python-no-factory", "a file without the factory", python_model("def build(table):\n    pass\n"), 2,
         "defines no function 'make'", "its functions: build"),
    Case("python-factory-raises", "a factory that raises", python_model("def make(table):\n    raise ValueError('hidden size must be even')\n"), 2,
         "the factory raised ValueError: hidden size must be even (block.py, line 2)", "fix the factory"),
    Case("python-factory-exits", "or that calls `sys.exit()`", python_model("def make(table):\n    raise SystemExit(4)\n"), 2,
         "the factory called sys.exit(4) (block.py, line 2)", "return the module and its inputs instead of exiting"),
    Case("python-forward-none", "a forward that returns no tensor", python_model(forward_returning("None")), 2,
         "its forward returned None; the pipeline measures a tensor, or a tuple or dict holding one", "return the output tensor"),
    Case("python-forward-strings", "a forward that returns no tensor", python_model(forward_returning("['a', 'b']")), 2,
         "its forward returned a list of 2 str and no tensor: ['a', 'b']", "return the output tensor"),
    Case("python-forward-exits", "a forward that returns no tensor", python_model(forward_returning("exit(5)")), 2,
         "its forward called sys.exit(5)", "return the output instead of exiting"),
    Case("python-not-a-pair", "returns something that is not a module", python_model("def make(table):\n    return 42\n"), 2,
         "the factory returned a int; it returns (module, inputs)", "return module, inputs"),
    Case("python-not-a-module", "returns something that is not a module", python_model(factory_returning("'a module'")), 2,
         "returned a str as its module; it must be a torch.nn.Module", "return the module itself"),
    Case("python-bad-description", "describes inputs the pipeline cannot feed",
         python_model(factory_returning("torch.nn.Linear(8, 8)", '[{"name": "x", "shape": ["batch", 8], "dtype": "uint8"}]')), 2,
         "input 'x' has the dtype 'uint8'", "the floating type of the variant"),
    Case("python-integer-unbounded", "describes inputs the pipeline cannot feed",
         python_model(factory_returning("torch.nn.Embedding(10, 8)", '[{"name": "ids", "shape": ["batch", "sequence"], "dtype": "int64"}]')), 2,
         "integer input 'ids' has no bound to draw below", "give 'high'"),
    Case("python-inputs-mismatch", "inputs that do not match what the module accepts",
         python_model(factory_returning("torch.nn.Linear(8, 8)", '[{"name": "x", "shape": ["batch", "sequence", 5]}]')), 2,
         "its forward failed on the inputs the factory describes (x ['batch', 'sequence', 5], the first 2×8×5): RuntimeError", "make the description's names"),
    Case("python-nothing-to-quantize", "a quantized variant of a module without Linear layers",
         python_model(factory_returning("torch.nn.GELU()", '[{"name": "x", "shape": ["batch", "sequence", 8]}]'), variant="int8"), 2,
         "block_int8: int8 quantization has nothing to act on: PyTorch module from block.py:make has no Linear layers",
         "measure block at fp32, fp16 or bf16: leave the int8 variant out for it"),
    Case("python-shapes-unsized", "a shape with the wrong number of sizes",
         python_model(LINEAR.replace('["batch", "sequence", 8]', '["batch", 8]')), 2,
         "has 2 size(s), but the model's dynamic axes are batch", "one size per axis"),
    # Shape-point manifests.
    Case("manifest-shape", "a `shape` that is not a shape point", measured_copy(set_shape("2by8"), "compare"), 1,
         "bert_fp32@2x8.json does not match the schema: Value error, '2by8' is not a shape", "re-run the stage that wrote it"),
    Case("manifest-named-for-another", "a file named for one engine or point that holds another",
         measured_copy(set_shape("3x24"), "compare"), 1,
         "bert_fp32@2x8.json is named for bert_fp32 at shape point 2x8 but holds bert_fp32 at shape point 3x24",
         "pipeline profile --engine bert_fp32 --toolchain onnxruntime"),
    # pipeline diff.
    Case("diff-missing-path", "a path that does not exist", measured_copy(None, "diff", "/no/such/run.log", LAYERS_110), 2,
         "/no/such/run.log does not exist: no such file or folder", "name an engine as TOOLCHAIN/ENGINE"),
    Case("diff-not-a-toolchain", "`DIR/NAME` that is no file or folder here", measured_copy(None, "diff", "runs/good", LAYERS_110), 2,
         "runs/good is no file or folder here, and 'runs' is no toolchain of the catalog", "the catalog's toolchains: onnxruntime"),
    Case("diff-close-toolchain", "`DIR/NAME` that is no file or folder here",
         measured_copy(None, "diff", "onnxruntim/bert_fp32", LAYERS_110), 2, "'onnxruntim' is no toolchain", "did you mean onnxruntime/bert_fp32?"),
    Case("diff-neither", "a name that is neither a file nor `TOOLCHAIN/ENGINE`", measured_copy(None, "diff", "vit_fp16", LAYERS_110), 2,
         "vit_fp16 does not exist", "name an engine as TOOLCHAIN/ENGINE"),
    Case("diff-never-built", "an engine of the workspace never built", measured_copy(None, "diff", "onnxruntime/bert_fp16", LAYERS_110), 1,
         "onnxruntime/bert_fp16 has not been built", "pipeline build --engine bert_fp16 --toolchain onnxruntime"),
    Case("diff-not-a-point", "`@SHAPE` that is not a shape point of the model",
         measured_copy(None, "diff", "onnxruntime/bert_fp32@9x9", LAYERS_110), 2,
         "'9x9' is not a shape point of model bert: its points are 2x8, 3x24", "onnxruntime/bert_fp32@POINT"),
    Case("diff-point-not-profiled", "or a point never profiled",
         measured_copy(lambda ws: point_manifest(ws, "3x24").unlink(), "diff", "onnxruntime/bert_fp32@3×24", LAYERS_110), 1,
         "onnxruntime/bert_fp32 has not been profiled at 3x24", "pipeline profile --engine bert_fp32 --toolchain onnxruntime"),
    Case("diff-two-models", "two engines of different models", measured_copy(None, "diff", "onnxruntime/bert_fp32", "onnxruntime/mine_fp32"), 2,
         "different models have no layers to match", "two variants of one model"),
    Case("diff-no-common-layer", "no layer of one matches a layer of the other",
         measured_copy(layer_json, "diff", LAYERS_110, "{ws}/other.json"), 2, "matches one of other.json by name or by ONNX node", "the same model"),
    Case("diff-no-layers", "a side with neither per-layer times nor layer information",
         measured_copy(times_only, "diff", "{ws}/times", LAYERS_110), 1, "holds neither per-layer times nor layer information", "pipeline profile"),
    Case("diff-onnxruntime", "engines of a runtime that records no layers", measured_copy(None, "diff", "onnxruntime/bert_fp32", "onnxruntime/bert_fp32"), 1,
         "has neither per-layer times nor layer information", "ONNX Runtime records no per-layer times or layer information"),
    Case("diff-broken-manifest", "a manifest of the engine that is broken",
         measured_copy(lambda ws: (ws / "manifests" / "onnxruntime" / "bert_fp32.json").write_text("{"), "diff", "onnxruntime/bert_fp32", LAYERS_110), 1,
         "bert_fp32.json is not JSON", "re-run the stage that wrote it"),
]  # fmt: skip


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """bert and a user's ONNX model, fp32 on ONNX Runtime at their shape points."""
    from pipeline.cli import main

    ws = tmp_path_factory.mktemp("measured")
    catalog = write_catalog(ws, BERT_CATALOG + USER_MODEL)
    user_graph(ws / "user.onnx")
    assert main(["--catalog", str(catalog), "run", "--model", "bert", "--model", "mine", "--variant", "fp32"]) == 0
    return ws


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_bad_input_is_an_error_with_a_tip_and_nothing_written(case, measured, tmp_path, run_cli):
    ws = tmp_path / "ws"
    catalog, args = case.setup(ws, measured)
    before = files_of(ws)
    result = run_cli(catalog, *args)
    assert result.exit_code == case.exit, result.err
    error = next((line for line in result.err.splitlines() if line.startswith("ERROR ")), "")
    assert case.message in " ".join(result.err.split()), result.err
    assert error, result.err
    assert any(line.startswith("TIP ") for line in result.err.splitlines()), f"no TIP: {result.err}"
    assert case.tip in " ".join(result.err.split()), result.err
    assert "Traceback" not in result.err and "INTERNAL ERROR" not in result.err
    assert files_of(ws) == before, "something was written"


def test_transformers_not_installed_is_exit_3_with_how_to_install_it(tmp_path, run_cli, monkeypatch):
    import sys

    catalog = write_catalog(tmp_path / "ws", BERT_CATALOG)
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    result = run_cli(catalog, "export", "--engine", "bert_fp32")
    assert result.exit_code == 3, result.err
    assert "need the transformers package, which is not installed" in result.err
    assert "TIP `make setup` installs it" in result.err
    assert not (tmp_path / "ws" / "models").exists()


def test_a_shape_written_as_the_report_prints_it_reads_as_the_point(measured, tmp_path, run_cli):
    """A manifest edited by hand with the report's "2×8" is the point 2x8: compare shows it there,
    and `pipeline diff` takes @3×24 for @3x24."""
    ws = tmp_path / "ws"
    shutil.copytree(measured, ws)
    set_shape("2×8")(ws)
    rows = json.loads(run_cli(ws / "pipeline.toml", "compare", "--format", "json", "--model", "bert").out)["rows"]
    assert sorted(row["shape"] for row in rows if row["toolchain"] == "onnxruntime" and row["variant"] == "fp32") == ["2x8", "3x24"]


def _bullets(path: Path) -> list[str]:
    """The lines of a doc's "## Bad input" section, each bullet with its continuation."""
    text = path.read_text()
    section = text[text.index("## Bad input") :]
    section = section[: section.find("\n## ", 3)] if "\n## " in section[3:] else section
    bullets, current = [], None
    for line in section.splitlines():
        if line.startswith("- "):
            current = line[2:]
            bullets.append(current)
        elif current is not None and line.startswith("  "):
            bullets[-1] += " " + line.strip()
        else:
            current = None
    return bullets


def test_every_line_of_the_docs_bad_input_sections_has_a_case():
    bullets = _bullets(REPO_ROOT / "docs" / "models.md") + _bullets(REPO_ROOT / "docs" / "diff.md")
    assert len(bullets) >= 20
    for case in CASES:
        assert any(case.doc in bullet for bullet in bullets), f"{case.id}: {case.doc!r} is in no docs line"
    for bullet in bullets:
        if "transformers not installed" in bullet:
            continue  # test_transformers_not_installed_is_exit_3_with_how_to_install_it
        assert any(case.doc in bullet for case in CASES), f"no case for: {bullet}"
