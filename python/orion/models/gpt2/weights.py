"""GPT-2 weights as float32 (or float16, as a half-precision checkpoint loads) numpy arrays in Orion's
conv layout, and Hugging Face checkpoints.

Orion stores every projection as ``[out, in]`` (a 1x1 conv's weight); Hugging Face GPT-2's
``Conv1D`` stores ``[in, out]``, so loading views those four matrices per block transposed (no
copy: an F32 or F16 checkpoint's arrays are read-only views of its map, ``weights_io``) and saving
transposes them back.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from orion.errors import OrionError
from orion.generation.hf_files import CONFIG_FILE
from orion.importance import Importance
from orion.models.gpt2.config import GPT2Config
from orion.models.weights_io import (
    PROGRESS_EVERY,
    PROGRESS_MIN_BYTES,
    SAVE_DTYPES,
    WEIGHTS_FILE,
    MappedSafetensors,
    WeightsSource,
    check_weight_shapes,
    content_hash,
    write_safetensors,
)

PREFIX = "transformer."
DIRECTORY_HELP = (
    "a GPT-2 directory holds a Hugging Face config.json and model.safetensors "
    "(and tokenizer.json for text in/out)"
)

# Orion field -> (name under "h.N." in a Hugging Face checkpoint, stored transposed as [in, out]).
_BLOCK_NAMES: dict[str, tuple[str, bool]] = {
    "ln1_g": ("ln_1.weight", False),
    "ln1_b": ("ln_1.bias", False),
    "w_qkv": ("attn.c_attn.weight", True),
    "b_qkv": ("attn.c_attn.bias", False),
    "w_attn_out": ("attn.c_proj.weight", True),
    "b_attn_out": ("attn.c_proj.bias", False),
    "ln2_g": ("ln_2.weight", False),
    "ln2_b": ("ln_2.bias", False),
    "w_fc": ("mlp.c_fc.weight", True),
    "b_fc": ("mlp.c_fc.bias", False),
    "w_proj": ("mlp.c_proj.weight", True),
    "b_proj": ("mlp.c_proj.bias", False),
}
_TOP_NAMES: dict[str, str] = {"wte": "wte.weight", "wpe": "wpe.weight", "ln_f_g": "ln_f.weight", "ln_f_b": "ln_f.bias"}
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers in older checkpoints
_FLOAT_DTYPES = {"F16", "F32", "F64", "BF16"}


class WeightsError(OrionError):
    """GPT-2 weights are missing, malformed or do not match their configuration."""


@dataclass
class BlockWeights:
    """One transformer block; projections are ``[out, in]``."""

    ln1_g: np.ndarray
    ln1_b: np.ndarray
    w_qkv: np.ndarray
    b_qkv: np.ndarray
    w_attn_out: np.ndarray
    b_attn_out: np.ndarray
    ln2_g: np.ndarray
    ln2_b: np.ndarray
    w_fc: np.ndarray
    b_fc: np.ndarray
    w_proj: np.ndarray
    b_proj: np.ndarray


@dataclass
class GPT2Weights:
    """All GPT-2 weights (float32 or float16); the LM head is tied to ``wte``. ``source``: the checkpoint they were
    loaded from (``load_hf``), None for weights made in memory."""

    wte: np.ndarray
    wpe: np.ndarray
    ln_f_g: np.ndarray
    ln_f_b: np.ndarray
    blocks: list[BlockWeights]
    source: WeightsSource | None = field(default=None, repr=False, compare=False)
    importance: Importance | None = field(default=None, repr=False, compare=False)  # as DecoderWeights'

    def arrays(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every array with its Orion name (``wte``, ``blocks.0.w_qkv``, ...), in a fixed order."""
        for name in _TOP_NAMES:
            yield name, getattr(self, name)
        for i, block in enumerate(self.blocks):
            for f in fields(BlockWeights):
                yield f"blocks.{i}.{f.name}", getattr(block, f.name)

    def validate(self, config: GPT2Config) -> None:
        """Raise :class:`WeightsError` unless every array is float32 or float16 with the shape ``config`` implies."""
        if len(self.blocks) != config.n_layer:
            raise WeightsError(f"GPT2Weights has {len(self.blocks)} blocks, config.n_layer is {config.n_layer}")
        check_weight_shapes("GPT2Weights", self.arrays(), expected_shapes(config), WeightsError)

    def content_hash(self, config: GPT2Config) -> str:
        """sha256 (hex) of the configuration and every array's name, shape and raw bytes (the checkpoint
        file's digest standing for the bytes while the arrays are the loaded ones)."""
        self.validate(config)
        return content_hash("orion-gpt2-weights-v1", json.dumps(config.to_hf_json(), sort_keys=True), self.arrays(),
                            self.source)


def expected_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Shape of each field of :class:`GPT2Weights` and :class:`BlockWeights` in Orion's layout."""
    c, f = config.n_embd, config.inner
    return {
        "wte": (config.vocab_size, c), "wpe": (config.n_positions, c), "ln_f_g": (c,), "ln_f_b": (c,),
        "ln1_g": (c,), "ln1_b": (c,), "w_qkv": (3 * c, c), "b_qkv": (3 * c,),
        "w_attn_out": (c, c), "b_attn_out": (c,), "ln2_g": (c,), "ln2_b": (c,),
        "w_fc": (f, c), "b_fc": (f,), "w_proj": (c, f), "b_proj": (c,),
    }


def random_weights(config: GPT2Config | None = None, seed: int = 0) -> GPT2Weights:
    """Deterministic weights with GPT-2's initialization.

    Matrices and embeddings are normal(0, 0.02); the residual projections (``w_attn_out``,
    ``w_proj``) are scaled by 1/sqrt(2 * n_layer); LayerNorm gammas are 1, betas and biases 0.
    """
    config = config or GPT2Config()
    rng = np.random.default_rng(seed)
    shapes = expected_shapes(config)
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)

    def normal(name: str, std: float = 0.02) -> np.ndarray:
        array = rng.standard_normal(shapes[name], dtype=np.float32)
        array *= np.float32(std)
        return array

    def const(name: str, value: float) -> np.ndarray:
        return np.full(shapes[name], value, np.float32)

    wte, wpe = normal("wte"), normal("wpe")
    blocks = [
        BlockWeights(
            ln1_g=const("ln1_g", 1.0), ln1_b=const("ln1_b", 0.0),
            w_qkv=normal("w_qkv"), b_qkv=const("b_qkv", 0.0),
            w_attn_out=normal("w_attn_out", residual_std), b_attn_out=const("b_attn_out", 0.0),
            ln2_g=const("ln2_g", 1.0), ln2_b=const("ln2_b", 0.0),
            w_fc=normal("w_fc"), b_fc=const("b_fc", 0.0),
            w_proj=normal("w_proj", residual_std), b_proj=const("b_proj", 0.0),
        )
        for _ in range(config.n_layer)
    ]
    return GPT2Weights(wte=wte, wpe=wpe, ln_f_g=const("ln_f_g", 1.0), ln_f_b=const("ln_f_b", 0.0), blocks=blocks)


def _hf_names(config: GPT2Config) -> dict[str, tuple[str, int | None, bool]]:
    """Hugging Face name (without ``transformer.``) -> (Orion field, block index or None, transposed)."""
    names: dict[str, tuple[str, int | None, bool]] = {hf: (ours, None, False) for ours, hf in _TOP_NAMES.items()}
    for i in range(config.n_layer):
        for ours, (hf, transposed) in _BLOCK_NAMES.items():
            names[f"h.{i}.{hf}"] = (ours, i, transposed)
    return names


def _require_file(directory: Path, name: str) -> Path:
    if not directory.is_dir():
        raise WeightsError(f"{directory}: no such directory; {DIRECTORY_HELP}")
    path = directory / name
    if not path.is_file():
        hint = ""
        if name == WEIGHTS_FILE and (directory / "pytorch_model.bin").is_file():
            hint = "; it has pytorch_model.bin only: re-save it as safetensors (save_pretrained(safe_serialization=True))"
        raise WeightsError(f"{path}: missing {name}; {DIRECTORY_HELP}{hint}")
    return path


def load_hf(path: str | os.PathLike[str], progress: bool | None = None) -> tuple[GPT2Config, GPT2Weights]:
    """Load a Hugging Face GPT-2 directory (``config.json`` + ``model.safetensors``) as read-only arrays
    at the stored precision (views of the file's map for F32 and F16, so nothing is copied or read until used;
    BF16 converted to float16).

    Tensor names may carry the ``transformer.`` prefix or not; ``lm_head.weight`` must be absent or
    equal to ``wte`` (tied). ``progress``: one line to stderr every few tensors (None: only for
    files of at least 64 MiB).
    """
    directory = Path(path)
    config = GPT2Config.from_hf_json(_require_file(directory, CONFIG_FILE))
    file = _require_file(directory, WEIGHTS_FILE)
    if progress is None:
        progress = file.stat().st_size >= PROGRESS_MIN_BYTES
    expected = _hf_names(config)
    shapes = expected_shapes(config)
    found: dict[str, np.ndarray] = {}
    stored_as: dict[str, str] = {}
    lm_head: np.ndarray | None = None
    try:
        handle = safe_open(str(file), framework="np")
        mapped = MappedSafetensors(file)
    except (SafetensorError, OSError, ValueError, struct.error) as exc:
        raise WeightsError(f"{file}: not a readable safetensors file ({exc})") from exc
    with handle as f:
        keys = sorted(k for k in f.keys() if not k.endswith(_BUFFER_SUFFIXES))
        for count, key in enumerate(keys, 1):
            name = key[len(PREFIX):] if key.startswith(PREFIX) else key
            if name != "lm_head.weight" and name not in expected:
                raise WeightsError(
                    f"{file}: unexpected tensor {key!r}: not a GPT-2 weight for n_layer={config.n_layer} "
                    f"(is config.json for this checkpoint?)"
                )
            if name in stored_as:
                raise WeightsError(f"{file}: tensor {name!r} stored twice, as {stored_as[name]!r} and {key!r}")
            stored_as[name] = key
            stored = f.get_slice(key)
            dtype, shape = stored.get_dtype(), tuple(stored.get_shape())
            if dtype not in _FLOAT_DTYPES:
                raise WeightsError(f"{file}: tensor {key!r} has dtype {dtype}; expected a float (F16, BF16, F32)")
            ours, _, transposed = expected.get(name, ("wte", None, False))  # lm_head.weight is [V, C] like wte
            want = shapes[ours][::-1] if transposed else shapes[ours]
            if shape != want:
                layout = " (Hugging Face Conv1D layout [in, out])" if transposed else ""
                raise WeightsError(
                    f"{file}: tensor {key!r} has shape {shape}, expected {want}{layout} "
                    f"for {CONFIG_FILE}'s n_embd={config.n_embd}, vocab_size={config.vocab_size}, "
                    f"n_positions={config.n_positions}"
                )
            array = mapped.array(key)
            if name == "lm_head.weight":
                lm_head = array
            else:
                found[name] = array.T if transposed else array
            if progress and (count % PROGRESS_EVERY == 0 or count == len(keys)):
                print(f"orion: loading {file.name}: {count}/{len(keys)} tensors", file=sys.stderr, flush=True)
    missing = [name for name in expected if name not in found]
    if missing:
        raise WeightsError(
            f"{file}: missing tensor {missing[0]!r} (looked for it with and without the {PREFIX!r} prefix)"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    if lm_head is not None and not np.array_equal(lm_head, found["wte.weight"]):
        raise WeightsError(
            f"{file}: {stored_as['lm_head.weight']!r} differs from wte.weight; "
            f"Orion's GPT-2 ties the LM head to the token embedding"
        )
    top = {ours: found[hf] for ours, hf in _TOP_NAMES.items()}
    blocks = [
        BlockWeights(**{ours: found[f"h.{i}.{hf}"] for ours, (hf, _) in _BLOCK_NAMES.items()})
        for i in range(config.n_layer)
    ]
    weights = GPT2Weights(**top, blocks=blocks)
    weights.source = WeightsSource([mapped], dict(weights.arrays()))
    weights.source.release_pages()  # the lm_head comparison read pages
    return config, weights


def save_hf(path: str | os.PathLike[str], config: GPT2Config, weights: GPT2Weights, dtype: str = "float32") -> None:
    """Write a standard Hugging Face GPT-2 directory: ``config.json`` and ``model.safetensors`` in ``dtype``
    (float32, float16 or bfloat16).

    Tensors are named ``transformer.h.N.*`` in ``Conv1D`` layout; the tied LM head is not stored.
    """
    if dtype not in SAVE_DTYPES:
        raise WeightsError(f"save_hf: dtype {dtype!r} is not one of {', '.join(SAVE_DTYPES)}")
    weights.validate(config)
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for hf, (ours, block, transposed) in _hf_names(config).items():
        array = getattr(weights if block is None else weights.blocks[block], ours)
        tensors[PREFIX + hf] = np.ascontiguousarray(array.T if transposed else array)
    (directory / CONFIG_FILE).write_text(json.dumps(config.to_hf_json(), indent=2) + "\n")
    write_safetensors(directory / WEIGHTS_FILE, tensors, SAVE_DTYPES[dtype])
