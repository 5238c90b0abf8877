"""Hugging Face transformers models: a model class built from its config class's defaults with the
catalog's overrides (random weights, seeded), or from a local folder holding ``config.json`` and
optionally weights. Never a download, never code from a model repository (``trust_remote_code``).

Their inputs are token ids and an attention mask (and token type ids where the class takes
them), with dynamic batch and sequence axes; the catalog's shape points ("2x512") are batch ×
sequence. The output every stage compares is the first one the model returns: the last hidden
state of a base model, the logits of a task head.

A decoder with a language-modelling head (``*ForCausalLM``) is measured as a prefill: one forward
over the whole prompt, no generation and no KV cache kept, computing the logits of the last
position only (transformers' ``logits_to_keep``), which are what is compared: their cosine, and
the top-1 agreement of the next token. Its prompts are padded on the left, as decoders' batches
are, so that the last position is a real token in every sequence; the causal mask is the one
transformers builds from the attention mask.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.catalog import ModelSpec
from pipeline.models.base import ModelInput, ModelSource, ShapePoint, attention_mask
from pipeline.models.transformers_weights import WEIGHTS_FOLDER, allocated, has_weights, seeded, seeded_key
from pipeline.models.transformers_weights import finished_writing as finished_writing  # the family's (pipeline/models: finished_writing)
from pipeline.running.errors import EnvironmentMissing, PipelineError, UsageError

# What each input the pipeline knows how to fill holds.
INPUT_KINDS = {"input_ids": "token_ids", "attention_mask": "attention_mask", "token_type_ids": "token_type_ids"}
AXES = ("batch", "sequence")
# Rotary position embeddings' inverse frequencies. transformers creates them in FP32, and a model
# loaded in bf16 (from_pretrained(dtype=torch.bfloat16)) keeps them so; `model.to(torch.bfloat16)`
# would round them to 8 bits, and the angle position × frequency with them: a bf16 Llama cast that
# way keeps a cosine of only 0.92 to its FP32 logits at 2048 tokens (0.9999 with them in FP32).
ROTARY_BUFFERS = ("inv_freq", "original_inv_freq")


class TransformersSpec(ModelSpec):
    """A Hugging Face transformers model class, e.g. ``BertModel`` or ``ModernBertModel``."""

    transformers: str = Field(description="the model class in transformers, e.g. ModernBertModel")
    # Overrides of the config class's defaults (e.g. num_hidden_layers = 2); checked against its keys.
    config: dict[str, Any] = {}
    # A local folder with config.json (and optionally weights): used instead of the class defaults.
    path: Path | None = None
    # The attention implementation transformers runs (and the export traces): "sdpa" or "eager".
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    # The inputs fed (each one the class's forward() takes); the graph has them in this order.
    inputs: tuple[Literal["input_ids", "attention_mask", "token_type_ids"], ...] = ("input_ids", "attention_mask")
    # Pad the sequences after the first of each batch to a seeded length (half to all of the
    # sequence), their attention mask zero beyond it, as real batches of text are.
    padding: bool = True
    # Token ids to calibrate quantization on instead of seeded ones: a .npy file of integers,
    # one sequence per row (samples × sequence), every id inside the vocabulary.
    calibration_tokens: Path | None = None

    @model_validator(mode="after")
    def _needs_points(self):
        if not self.shapes:
            raise ValueError('a transformers model is measured at shape points: list them, e.g. shapes = ["2x512"] (batch x sequence)')
        return self

    @field_validator("inputs")
    @classmethod
    def _needs_ids(cls, inputs: tuple[str, ...]) -> tuple[str, ...]:
        if "input_ids" not in inputs:
            raise ValueError("the inputs must include input_ids")
        if len(set(inputs)) != len(inputs):
            raise ValueError("an input is listed twice")
        # In forward()'s order: exporters name the graph's inputs by position.
        return tuple(name for name in INPUT_KINDS if name in inputs)

    def family(self) -> str:
        return "transformers"


def import_transformers():
    """transformers, or exit 3 with how to install it."""
    from pipeline.models.torch_import import import_torch

    import_torch()  # torchvision's quirk on CPU-only torch handled first: transformers imports it too
    try:
        import transformers
    except ImportError as exc:
        raise EnvironmentMissing(
            f"Hugging Face transformers models need the transformers package, which is not installed ({exc}).",
            hint="`make setup` installs it; or `pip install 'trt-pipeline[export]'`",
        ) from None
    return transformers


class TransformersModel(ModelSource):
    """A transformers model class with token inputs of dynamic batch and sequence."""

    family = "transformers"
    Spec = TransformersSpec
    exporter = "dynamo"
    quantize_linear_only = True
    packages = ("transformers",)

    def weights_words(self) -> str:
        return f"as in {self.spec.path}" if self.spec.path else super().weights_words()

    def describe(self) -> str:
        where = f" from {self.spec.path}" if self.spec.path else ""
        return f"transformers {self.spec.transformers}{where} ({self.spec.attn_implementation} attention)"

    def describe_calibration(self, directory: Path | None, samples: int, batch_size: int) -> dict[str, Any]:
        described = super().describe_calibration(directory, samples, batch_size)
        if self.spec.calibration_tokens is not None:
            return {**described, "source": f"token ids from {self.spec.calibration_tokens}"}
        return {**described, "source": "seeded token ids (uniform over the vocabulary) and attention masks at the first shape point"}

    def input_files(self) -> list[Path]:
        """The local folder's files (config and weights) and the calibration tokens, if any."""
        files = sorted(p for p in self.folder().iterdir() if p.is_file()) if self.spec.path is not None else []
        return files + ([self.tokens_path()] if self.spec.calibration_tokens is not None else [])

    def tokens_path(self) -> Path:
        path = self.in_workspace(self.spec.calibration_tokens)
        if not path.is_file():
            raise UsageError(
                f"model {self.name!r}: calibration_tokens file {path} does not exist.", hint="fix `calibration_tokens` in pipeline.toml"
            )
        return path

    def calibration_batches(self, model, directory: Path | None, samples: int, batch_size: int) -> list[tuple]:
        """The user's token ids (checked against the vocabulary), else seeded ones."""
        if self.spec.calibration_tokens is None:
            return super().calibration_batches(model, directory, samples, batch_size)
        import numpy as np
        import torch

        tokens = self._token_ids(model, self.tokens_path())
        tokens = torch.from_numpy(tokens[:samples].astype(np.int64))
        values = {"attention_mask": torch.ones_like(tokens), "token_type_ids": torch.zeros_like(tokens)}
        return [
            tuple(batch if name == "input_ids" else values[name][start : start + batch_size] for name in self.spec.inputs)
            for start, batch in ((start, tokens[start : start + batch_size]) for start in range(0, len(tokens), batch_size))
        ]

    def token_rows(self, model, path: Path) -> int:
        return len(self._token_ids(model, path))

    def token_batches(self, model, path: Path, rows: list[int]) -> tuple:
        """Those rows of a token-id file (`--eval-tokens`) as one batch, every position attended."""
        import numpy as np
        import torch

        tokens = torch.from_numpy(self._token_ids(model, path)[rows].astype(np.int64))
        values = {"input_ids": tokens, "attention_mask": torch.ones_like(tokens), "token_type_ids": torch.zeros_like(tokens)}
        return tuple(values[name] for name in self.spec.inputs)

    def _token_ids(self, model, path: Path):
        """A .npy of token ids, one sequence per row, checked against the model's vocabulary and length."""
        import numpy as np

        try:
            tokens = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"model {self.name!r}: {path} is not a .npy array: {exc}.",
                hint="save the token ids with numpy.save(path, ids), an integer array of samples × sequence",
            ) from None
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer) or not tokens.size:
            raise UsageError(
                f"model {self.name!r}: {path} holds a {tokens.dtype} array of shape {list(tokens.shape)}; token ids are integers, "
                "one sequence per row (samples × sequence).",
                hint="save a 2-D integer array: ids[None, :] for a single sequence, ids.reshape(-1, length) for one long one",
            )
        vocab = int(model.config.vocab_size)
        bad = np.argwhere((tokens < 0) | (tokens >= vocab))
        if bad.size:
            row, column = (int(i) for i in bad[0])
            raise UsageError(
                f"model {self.name!r}: token id {int(tokens[row, column])} at row {row}, position {column} of {path} is outside "
                f"the vocabulary (0 to {vocab - 1}); {len(bad)} id(s) are.",
                hint="tokenize with the model's own tokenizer, or set vocab_size in its config",
            )
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and tokens.shape[1] > limit:
            raise UsageError(
                f"model {self.name!r}: the sequences of {path} are {tokens.shape[1]} long; the model takes at most {limit}.",
                hint=f"cut the sequences to at most {limit} tokens (ids[:, :{limit}])",
            )
        return tokens

    def facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "transformers_class": self.spec.transformers,
            "config": dict(sorted(self.spec.config.items())),
            "attn_implementation": self.spec.attn_implementation,
            "inputs": list(self.spec.inputs),
            "padding": self.spec.padding,
            # What a cast to fp16/bf16 leaves in FP32 (cast()): a change to it is a new export.
            "kept_in_fp32": list(ROTARY_BUFFERS),
        }
        if self.spec.path is not None:
            facts["path"] = str(self.spec.path)
        return facts

    # --- the model ------------------------------------------------------------------------------

    def folder(self) -> Path:
        folder = self.in_workspace(self.spec.path)
        if not folder.is_dir():
            raise UsageError(f"model {self.name!r}: folder {folder} does not exist.", hint="fix `path` in pipeline.toml")
        config = folder / "config.json"
        if not config.is_file():
            raise UsageError(
                f"model {self.name!r}: {folder} has no config.json, which says what the model is.",
                hint="point `path` at a folder saved by save_pretrained(), or remove it to build the model from its config class",
            )
        try:
            raw = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"model {self.name!r}: {config} is not readable JSON: {exc}.",
                hint="save the folder again with save_pretrained(), or fix config.json",
            ) from None
        if isinstance(raw, dict) and raw.get("auto_map"):
            raise UsageError(
                f"model {self.name!r}: {config} maps the model to code of its own (auto_map: {', '.join(raw['auto_map'])}); "
                "running a model repository's code (trust_remote_code) is refused.",
                hint="use a model class that transformers itself provides",
            )
        return folder

    def model_class(self):
        transformers = import_transformers()
        name = self.spec.transformers
        cls = getattr(transformers, name, None) if name.isidentifier() else None
        if cls is None or not inspect.isclass(cls) or not hasattr(cls, "config_class"):
            known = [n for n in dir(transformers) if n.endswith(("Model", "ForSequenceClassification", "ForMaskedLM", "ForCausalLM"))]
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            raise UsageError(
                f"model {self.name!r}: transformers {transformers.__version__} has no model class {name!r}.",
                hint=(f"did you mean {' or '.join(repr(c) for c in close)}? " if close else "")
                + "models whose code lives in their repository (trust_remote_code) are not run",
            )
        return cls

    def model_config(self, cls):
        """The config: the folder's config.json or the class defaults, with the catalog's overrides."""
        overrides = dict(self.spec.config)
        if self.spec.path is not None:
            config = cls.config_class.from_pretrained(str(self.folder()), local_files_only=True)
        else:
            config = cls.config_class()
        # A key is what the config's dict holds, or a public property it can set: in transformers 5
        # `num_labels` is one (it makes id2label) and its dict has id2label only.
        settable = {name for name, value in inspect.getmembers(type(config)) if isinstance(value, property) and value.fset is not None}
        known = set(config.to_dict()) | {name for name in settable if not name.startswith("_")}
        unknown = sorted(key for key in overrides if key not in known)
        if unknown:
            close = {key: difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6) for key in unknown}
            suggestions = [f"{key!r} → {close[key][0]!r}" for key in unknown if close[key]]
            raise UsageError(
                f"model {self.name!r}: {cls.config_class.__name__} has no key(s) {', '.join(repr(k) for k in unknown)}.",
                hint=(f"did you mean {', '.join(suggestions)}? " if suggestions else "")
                + f"its keys: {', '.join(sorted(k for k in known if not k.startswith('_')))}",
            )
        for key, value in overrides.items():
            setattr(config, key, value)
        config._attn_implementation = self.spec.attn_implementation
        return config

    def import_libraries(self) -> None:
        import_transformers()

    def create(self):
        return self._create(initialise=True)

    def _create(self, initialise: bool):
        import torch

        cls = self.model_class()
        config = self.model_config(cls)
        parameters = inspect.signature(cls.forward).parameters
        missing = [name for name in self.spec.inputs if name not in parameters]
        if missing:
            raise UsageError(
                f"model {self.name!r}: {cls.__name__}.forward() takes no {', '.join(missing)}.",
                hint="set `inputs` to ones it takes (of input_ids, attention_mask, token_type_ids)",
            )
        if self.is_decoder() and "logits_to_keep" not in parameters:
            raise UsageError(
                f"model {self.name!r}: {cls.__name__}.forward() takes no logits_to_keep, which a prefill needs to compute "
                "the last position's logits only.",
                hint="measure its base model (the class without ForCausalLM) instead",
            )
        torch.manual_seed(self.spec.seed)
        try:
            if self.spec.path is not None and has_weights(self.folder()):
                model = cls.from_pretrained(
                    str(self.folder()), config=config, local_files_only=True, trust_remote_code=False, torch_dtype=torch.float32
                )
            elif initialise:
                model = seeded(cls, config, self.spec.seed, self.workspace_root / WEIGHTS_FOLDER)
            else:
                model = allocated(cls, config)
        # AssertionError: torch's own checks of a config (an embedding's padding_idx beyond its size).
        except (ValueError, RuntimeError, OSError, TypeError, AssertionError) as exc:
            raise PipelineError(
                f"transformers could not create {cls.__name__} for model {self.name!r}: {str(exc).strip().splitlines()[0]}",
                hint="check the model's config overrides in pipeline.toml",
            ) from exc
        return model.float().eval()

    def weights_key(self):
        # Seeded weights only: a folder's weights may be saved again between two runs of a process.
        if self.spec.path is not None and has_weights(self.folder()):
            return None
        cls = self.model_class()
        return seeded_key(cls, self.model_config(cls), self.spec.seed)

    def create_for_weights(self):
        # Initialising ModernBERT-base's 149M weights took 6.3 s of a two-core machine (10 ms
        # without) in every process that reads a PyTorch engine back — a point's worker once per
        # engine — and the engine's state dict replaces every one of them. transformers' own
        # from_pretrained skips it the same way; buffers a model computes (rotary frequencies)
        # are made as before.
        return self._create(initialise=False)

    def is_decoder(self) -> bool:
        """A language model measured as a prefill (see the module's docstring)."""
        return self.spec.transformers.endswith("ForCausalLM")

    def runnable(self, model):
        return _first_output_class()(model, tuple(self.spec.inputs), self.is_decoder()).eval()

    def cast(self, model, dtype):
        """In ``dtype``, but for the rotary embeddings' frequencies, which stay FP32 (ROTARY_BUFFERS)."""
        import torch

        kept = [
            (module, name, buffer)
            for module in model.modules()
            for name in ROTARY_BUFFERS
            if isinstance(buffer := module._buffers.get(name), torch.Tensor) and buffer.is_floating_point()
        ]
        model = model.to(dtype)
        for module, name, buffer in kept:
            module._buffers[name] = buffer.float()
        return model

    def use_attention(self, model, implementation: str) -> None:
        inner = model.model
        try:
            if hasattr(inner, "set_attn_implementation"):
                inner.set_attn_implementation(implementation)
            else:  # releases before it: the attention modules read the config at each call
                inner.config._attn_implementation = implementation
        except (ValueError, ImportError) as exc:  # transformers' own word on what this class supports
            raise UsageError(
                f"model {self.name!r}: {type(model.model).__name__} cannot use {implementation} attention: {str(exc).strip().splitlines()[0]}",
                hint="choose another attn_implementation for the toolchain",
            ) from exc

    # --- inputs ---------------------------------------------------------------------------------

    def inputs(self, model) -> list[ModelInput]:
        return [ModelInput(name, AXES, "int64", INPUT_KINDS[name]) for name in self.spec.inputs]

    def output_name(self) -> str:
        if self.is_decoder():
            return "next_token_logits"
        return "last_hidden_state" if self.spec.transformers.endswith("Model") else "logits"

    def dynamic_axes(self) -> tuple[str, ...]:
        return AXES

    def check_point(self, model, point: ShapePoint) -> None:
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None) if model is not None else self._position_limit()
        if limit is not None and point.size("sequence") > limit:
            raise UsageError(
                f"model {self.name!r}: shape {point} has sequence length {point.size('sequence')}, longer than the "
                f"model's max_position_embeddings ({limit}).",
                hint=f"measure at sequences of at most {limit}, or raise max_position_embeddings in the model's config",
            )

    def _position_limit(self) -> int | None:
        """The longest sequence the configuration allows, without creating the model (the class's
        default configuration is read only when the catalog does not set it)."""
        if "max_position_embeddings" in self.spec.config:
            return int(self.spec.config["max_position_embeddings"])
        return getattr(self.model_config(self.model_class()), "max_position_embeddings", None)

    def sample_inputs(self, model, point: ShapePoint | None, seed: int) -> tuple:
        """Token ids drawn uniformly from the vocabulary, an attention mask (sequences after the first
        padded to a seeded length when `padding` is on) and zero token types, all seeded."""
        import torch

        if point is None:
            raise PipelineError(f"model {self.name!r} has no shape points.", hint='list them in pipeline.toml, e.g. shapes = ["2x128"]')
        batch, sequence = point.size("batch"), point.size("sequence")
        generator = torch.Generator().manual_seed(seed)
        vocab = int(getattr(model.config, "vocab_size", 2) if model is not None else 2)
        ids = torch.randint(0, vocab, (batch, sequence), generator=generator, dtype=torch.int64)
        mask = attention_mask((batch, sequence), torch.int64, generator, self.spec.padding)
        if self.is_decoder():
            mask = mask.flip(1)  # padded on the left: the last position is a real token
        values = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros(batch, sequence, dtype=torch.int64)}
        return tuple(values[name] for name in self.spec.inputs)


@functools.cache
def _first_output_class():
    """The wrapper class, made on first use: torch is not imported with this module."""
    import torch

    class FirstOutput(torch.nn.Module):
        """A transformers model called with its inputs by name, returning its first output. The
        parameters are named so that exporters name the graph's inputs after them."""

        def __init__(self, model, names: tuple[str, ...], prefill: bool = False):
            super().__init__()
            self.model, self.names, self.prefill = model, names, prefill
            self.config = model.config

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            inputs = {name: given[name] for name in self.names}
            if self.prefill:
                # One forward over the prompt: no cache kept, the language-model head applied to
                # the last position only (batch × vocabulary, not batch × sequence × vocabulary).
                return self.model(**inputs, use_cache=False, logits_to_keep=1)[0][:, -1, :]
            return self.model(**inputs)[0]

    return FirstOutput
