"""Llama-family weights as float32 or float16 numpy arrays (projections ``[out, in]``; float16 as an F16 or BF16
checkpoint loads, without a float32 copy), and their checkpoint formats:
Hugging Face directories (``model.safetensors`` or a sharded ``model.safetensors.index.json``, in fp32,
fp16 or bf16) and llama2.c's legacy ``.bin``.

RoPE conventions: llama2.c/Meta weights rotate interleaved channel pairs (2i, 2i+1) of each head;
Hugging Face checkpoints store the same q/k rows permuted per head so that rotate-half pairs
(i, i + head_dim/2) give the same attention. :func:`to_rope_convention` applies that permutation, so
the two layouts compute identical logits.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from orion.errors import OrionError
from orion.models.hf_checkpoint import Checkpoint, DecoderWeights, attach_source, hf_names, load_hf_dir, save_hf_dir
from orion.models.llama.config import LlamaConfig
from orion.models.weights_io import INDEX_FILE, WEIGHTS_FILE, write_safetensors  # noqa: F401 (callers import them here)

DIRECTORY_HELP = (
    "a Llama-family directory holds a Hugging Face config.json and model.safetensors "
    "(or model.safetensors.index.json with its shards)"
)
LLAMA2C_MAGIC = 0x616B3432  # "ak42": llama2.c's versioned export formats (Orion reads the legacy one)
LLAMA2C_HEADER = struct.Struct("<7i")  # dim, hidden_dim, n_layers, n_heads, n_kv_heads, +-vocab_size, seq_len
LLAMA2C_THETA, LLAMA2C_EPS = 10000.0, 1e-5  # fixed by llama2.c's model.py and run.c
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)  # RoPE buffers older transformers saved; recomputed from theta

# Orion field -> name under "model.layers.N." in a Hugging Face checkpoint.
_LAYER_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
    "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias", "bv": "self_attn.v_proj.bias",
    "wo": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight", "w_down": "mlp.down_proj.weight",
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
}
# Checkpoints of a fused variant (Phi-3) store these as one tensor each, their rows stacked in this order.
_FUSED_NAMES: dict[str, tuple[str, ...]] = {"self_attn.qkv_proj.weight": ("wq", "wk", "wv"),
                                            "mlp.gate_up_proj.weight": ("w_gate", "w_up")}
_BIASES = ("bq", "bk", "bv")
_HEAD_NORMS = ("q_norm", "k_norm")
_LAYER_FUSED = {"qkv": "self_attn.qkv_proj.weight", "gate_up": "mlp.gate_up_proj.weight"}
_LLAMA2C_LAYER_ORDER = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_down", "w_up")


class WeightsError(OrionError):
    """Llama weights are missing, malformed or do not match their configuration."""


@dataclass
class LayerWeights:
    """One decoder layer; projections are ``[out, in]``; q/k/v biases only for ``config.qkv_bias``, the per-head
    q/k RMSNorm gains ``[head_dim]`` only for ``config.qk_norm``."""

    attn_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    mlp_norm: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None


@dataclass
class LlamaWeights(DecoderWeights[LayerWeights]):
    """All weights (float32, or float16 as a half-precision checkpoint loads); ``lm_head`` is None when the LM head
    is tied to ``embed``. ``source``: the checkpoint they were loaded from (``load_hf``), None for weights made in
    memory."""

    HASH_TAG = "orion-llama-weights-v1"
    OPTIONAL = {**dict.fromkeys(_BIASES, "qkv_bias"), **dict.fromkeys(_HEAD_NORMS, "qk_norm")}

    def validate(self, config: LlamaConfig) -> None:
        """Raise :class:`WeightsError` unless every array is float32 or float16 with the shape ``config`` implies,
        biases are present exactly when ``config.qkv_bias``, q/k norms exactly when ``config.qk_norm`` and the LM
        head exactly when untied."""
        self.check(config, expected_shapes(config), WeightsError)


def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Shape of each field of :class:`LlamaWeights` and :class:`LayerWeights` (and of a fused checkpoint's
    ``qkv`` and ``gate_up``)."""
    d, q, kv, h = config.dim, config.q_dim, config.kv_dim, config.hidden_dim
    return {
        "embed": (config.vocab_size, d), "norm": (d,), "lm_head": (config.vocab_size, d),
        "attn_norm": (d,), "wq": (q, d), "wk": (kv, d), "wv": (kv, d), "bq": (q,), "bk": (kv,), "bv": (kv,),
        "wo": (d, q), "mlp_norm": (d,), "w_gate": (h, d), "w_up": (h, d), "w_down": (d, h),
        "q_norm": (config.head_dim,), "k_norm": (config.head_dim,), "qkv": (q + 2 * kv, d), "gate_up": (2 * h, d),
    }


def random_weights(config: LlamaConfig, seed: int = 0) -> LlamaWeights:
    """Deterministic weights with llama2.c's initialization: matrices normal(0, 0.02), ``wo`` and ``w_up``
    (llama2.c's w3) scaled by 1/sqrt(2 * n_layers), RMSNorm gains 1 (q/k norms too); q/k/v biases normal(0, 0.02)."""
    rng = np.random.default_rng(seed)
    shapes = expected_shapes(config)
    residual_std = 0.02 / math.sqrt(2 * config.n_layers)

    def normal(name: str, std: float = 0.02) -> np.ndarray:
        array = rng.standard_normal(shapes[name], dtype=np.float32)
        array *= np.float32(std)
        return array

    def ones(name: str) -> np.ndarray:
        return np.ones(shapes[name], np.float32)

    embed = normal("embed")
    layers = [
        LayerWeights(attn_norm=ones("attn_norm"), wq=normal("wq"), wk=normal("wk"), wv=normal("wv"),
                     wo=normal("wo", residual_std), mlp_norm=ones("mlp_norm"), w_gate=normal("w_gate"),
                     w_up=normal("w_up", residual_std), w_down=normal("w_down"),
                     **({b: normal(b) for b in _BIASES} if config.qkv_bias else {}),
                     **({n: ones(n) for n in _HEAD_NORMS} if config.qk_norm else {}))
        for _ in range(config.n_layers)
    ]
    lm_head = None if config.tie_embeddings else normal("lm_head")
    return LlamaWeights(embed=embed, norm=ones("norm"), layers=layers, lm_head=lm_head)


# -- RoPE conventions --------------------------------------------------------------------------------

def _half_order(head_dim: int) -> np.ndarray:
    """Row order turning interleaved pairs into rotate-half pairs: half row j = interleaved row order[j]."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def _head_rows(heads: int, order: np.ndarray) -> np.ndarray:
    return (np.arange(heads)[:, None] * len(order) + order[None, :]).reshape(-1)


def _permute_heads(array: np.ndarray, heads: int, order: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array[_head_rows(heads, order)])


def interleaved_rows(heads: int, head_dim: int) -> np.ndarray:
    """For q (``heads = n_heads``) or k (``n_kv_heads``) rows in rotate-half order: the interleaved row each one is
    (the rows :func:`to_rope_convention` takes to convert to ``"half"``)."""
    return _head_rows(heads, _half_order(head_dim))


def hf_rows(config: LlamaConfig, heads: int) -> np.ndarray:
    """For q (``heads = n_heads``) or k (``n_kv_heads``): the Hugging Face (rotate-half) row of each of Orion's rows
    in ``config``'s RoPE convention, as :func:`to_rope_convention` permutes them."""
    order = _half_order(config.head_dim)
    return _head_rows(heads, np.argsort(order) if config.rope_convention == "interleaved" else np.arange(len(order)))


def to_rope_convention(config: LlamaConfig, weights: LlamaWeights, convention: str) -> tuple[LlamaConfig, LlamaWeights]:
    """The same model with its q/k rows (and biases, q/k norm gains) permuted per head for ``convention``; logits
    are unchanged."""
    target = replace(config, rope_convention=convention)  # validates the name
    if config.rotary_dim != config.head_dim and convention != config.rope_convention:
        raise WeightsError(f"to_rope_convention: RoPE rotates {config.rotary_dim} of {config.head_dim} channels; "
                           "only full-head RoPE converts between conventions")
    if convention == config.rope_convention:
        return target, weights
    order = _half_order(config.head_dim)
    if convention == "interleaved":
        order = np.argsort(order)
    layers = []
    for layer in weights.layers:
        changes = {"wq": _permute_heads(layer.wq, config.n_heads, order),
                   "wk": _permute_heads(layer.wk, config.n_kv_heads, order)}
        if layer.bq is not None:
            changes["bq"] = _permute_heads(layer.bq, config.n_heads, order)
            changes["bk"] = _permute_heads(layer.bk, config.n_kv_heads, order)
        if layer.q_norm is not None:  # one gain per channel of a head: permuted as each head's rows
            changes["q_norm"], changes["k_norm"] = layer.q_norm[order], layer.k_norm[order]
        layers.append(replace(layer, **changes))
    return target, replace(weights, layers=layers)


# -- Hugging Face directories ------------------------------------------------------------------------

def _hf_names(config: LlamaConfig) -> dict[str, tuple[str, int | None]]:
    """Hugging Face tensor name -> (Orion field, layer index or None) for every tensor the checkpoint stores (a
    fused variant's ``qkv_proj``/``gate_up_proj`` as the pseudo-fields ``qkv``/``gate_up``)."""
    fused = {part for parts in _FUSED_NAMES.values() for part in parts} if config.variant.fused_checkpoint else set()
    layer_names = _LAYER_NAMES | (_LAYER_FUSED if fused else {})
    return hf_names(config.n_layers, config.tie_embeddings, layer_names,
                    lambda ours: (ours not in _BIASES or config.qkv_bias) and (ours not in _HEAD_NORMS or config.qk_norm)
                    and ours not in fused)


def load_hf(path: str | os.PathLike[str], progress: bool | None = None) -> tuple[LlamaConfig, LlamaWeights]:
    """Load a Hugging Face directory of a Llama-layer family (tensors stored as F32, F16 or BF16): read-only
    views of the files' maps at their stored precision (BF16 converted to float16, ``weights_io``); a fused
    checkpoint's ``qkv_proj``/``gate_up_proj`` split into their row blocks.

    Every stored tensor must be one the config implies (except RoPE ``inv_freq`` buffers); a tied
    checkpoint may store ``lm_head.weight`` only if it equals the embedding. ``progress``: a line to
    stderr every few tensors (None: only for at least 64 MiB of weights).
    """
    directory = Path(path)
    if not directory.is_dir():
        raise WeightsError(f"{directory}: no such directory; {DIRECTORY_HELP}")
    config = LlamaConfig.from_hf_json(directory)
    about = (f"{config.model_type} config (n_layers={config.n_layers}, q/k/v biases: {config.qkv_bias}, "
             f"tied: {config.tie_embeddings})")
    spec = Checkpoint(config, _hf_names(config), expected_shapes(config), about, WeightsError, DIRECTORY_HELP,
                      ignored=_IGNORED_SUFFIXES)
    top, layers, mapped = load_hf_dir(directory, spec, progress)
    weights = LlamaWeights(**top, layers=[LayerWeights(**_split_fused(config, fields)) for fields in layers])
    attach_source(weights, mapped)
    return config, weights


def _split_fused(config: LlamaConfig, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One layer's ``fields`` with a fused checkpoint's ``qkv``/``gate_up`` replaced by views of their row blocks."""
    rows = {"wq": config.q_dim, "wk": config.kv_dim, "wv": config.kv_dim, "w_gate": config.hidden_dim,
            "w_up": config.hidden_dim}
    out = dict(fields)
    for ours, hf in _LAYER_FUSED.items():
        fused = out.pop(ours, None)
        if fused is not None:
            parts = _FUSED_NAMES[hf]
            starts = np.cumsum([0] + [rows[p] for p in parts])
            out.update({p: fused[a:b] for p, a, b in zip(parts, starts[:-1], starts[1:], strict=True)})
    return out


def save_hf(path: str | os.PathLike[str], config: LlamaConfig, weights: LlamaWeights, dtype: str = "float32",
            max_shard_bytes: int | None = None) -> None:
    """Write a Hugging Face directory transformers reads: ``config.json`` and ``model.safetensors``, or with
    ``max_shard_bytes`` shards plus ``model.safetensors.index.json``. Interleaved-RoPE weights are
    permuted to rotate-half first; a tied LM head is not stored; a fused variant's q/k/v and gate/up are
    written as its ``qkv_proj``/``gate_up_proj``."""
    weights.validate(config)
    config, weights = to_rope_convention(config, weights, "half")

    def tensor(owner: object, ours: str) -> np.ndarray:
        if ours in _LAYER_FUSED:  # a fused variant's stacked rows
            return np.concatenate([getattr(owner, p) for p in _FUSED_NAMES[_LAYER_FUSED[ours]]])
        return getattr(owner, ours)

    save_hf_dir(path, config.to_hf_json(), weights.by_hf_name(_hf_names(config), tensor), dtype, WeightsError,
                max_shard_bytes)


# -- llama2.c legacy .bin --------------------------------------------------------------------------

def llama2c_freq_tables(head_dim: int, seq_len: int, theta: float = LLAMA2C_THETA) -> tuple[np.ndarray, np.ndarray]:
    """llama2.c's ``freq_cis_real`` and ``freq_cis_imag`` tables, ``[seq_len, head_dim / 2]`` float32."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2)[: head_dim // 2].astype(np.float32) / head_dim)
    angles = np.outer(np.arange(seq_len, dtype=np.float32), freqs.astype(np.float32))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _llama2c_layout(config: LlamaConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(Orion field, shape) of every tensor in file order; layer tensors are stacked ``[n_layers, ...]``."""
    shapes, n = expected_shapes(config), config.n_layers
    half = config.head_dim // 2
    layout = [("embed", shapes["embed"])]
    layout += [(f, (n, *shapes[f])) for f in _LLAMA2C_LAYER_ORDER]
    layout += [("norm", shapes["norm"]), ("freq_cis_real", (config.max_position_embeddings, half)),
               ("freq_cis_imag", (config.max_position_embeddings, half))]
    if not config.tie_embeddings:
        layout.append(("lm_head", shapes["lm_head"]))
    return layout


def load_llama2c(path: str | os.PathLike[str]) -> tuple[LlamaConfig, LlamaWeights]:
    """Load a llama2.c legacy checkpoint (``export.py --version 0``, e.g. ``stories110M.bin``): a 7 x int32
    header, then fp32 tensors in llama2.c's order; a negative vocab size means an untied classifier."""
    file = Path(path)
    if not file.is_file():
        raise WeightsError(f"{file}: no such file; expected a llama2.c legacy .bin checkpoint")
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(LLAMA2C_HEADER.size)
    if len(head) < LLAMA2C_HEADER.size:
        raise WeightsError(f"{file}: {size} bytes, too short for llama2.c's 28-byte header")
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = LLAMA2C_HEADER.unpack(head)
    if dim == LLAMA2C_MAGIC:
        raise WeightsError(f"{file}: starts with llama2.c's 'ak42' magic (a versioned export); Orion reads the "
                           "legacy format. Fix: re-export with llama2.c's export.py --version 0")
    if n_heads <= 0 or dim % n_heads:
        raise WeightsError(f"{file}: header dim={dim}, n_heads={n_heads}: dim must be a positive multiple of n_heads")
    try:
        config = LlamaConfig(dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv, head_dim=dim // n_heads,
                             hidden_dim=hidden, vocab_size=abs(vocab), max_position_embeddings=seq_len,
                             rms_norm_eps=LLAMA2C_EPS, rope_theta=LLAMA2C_THETA, rope_convention="interleaved",
                             tie_embeddings=vocab > 0, bos_token_id=1, eos_token_ids=(2,))
    except OrionError as exc:
        raise WeightsError(f"{file}: header (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len) = "
                           f"{(dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len)} is not a valid model: {exc}") from None
    layout = _llama2c_layout(config)
    want = LLAMA2C_HEADER.size + 4 * sum(math.prod(shape) for _, shape in layout)
    if size != want:
        raise WeightsError(f"{file}: {size} bytes, but its header (dim={dim}, hidden_dim={hidden}, n_layers={n_layers}, "
                           f"n_heads={n_heads}, n_kv_heads={n_kv}, vocab_size={vocab}, seq_len={seq_len}) implies {want}; "
                           "the file is truncated or not a llama2.c legacy checkpoint")
    data = np.memmap(file, dtype="<f4", mode="r", offset=LLAMA2C_HEADER.size)
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for name, shape in layout:
        count = math.prod(shape)
        arrays[name] = np.array(data[offset:offset + count], dtype=np.float32).reshape(shape)
        offset += count
    del data
    cos, sin = llama2c_freq_tables(config.head_dim, seq_len)
    if not (np.allclose(arrays["freq_cis_real"], cos, atol=1e-4) and np.allclose(arrays["freq_cis_imag"], sin, atol=1e-4)):
        raise WeightsError(f"{file}: freq_cis tables are not RoPE's with theta={LLAMA2C_THETA:g} for head_dim "
                           f"{config.head_dim}; the checkpoint is corrupt or not a llama2.c model")
    layers = [LayerWeights(**{f: arrays[f][i] for f in _LLAMA2C_LAYER_ORDER}) for i in range(n_layers)]
    return config, LlamaWeights(embed=arrays["embed"], norm=arrays["norm"], layers=layers,
                                lm_head=arrays.get("lm_head"))


def save_llama2c(path: str | os.PathLike[str], config: LlamaConfig, weights: LlamaWeights) -> None:
    """Write a llama2.c legacy ``.bin`` (what ``export.py --version 0`` writes); rotate-half weights are
    permuted to interleaved pairs first."""
    weights.validate(config)
    fixed = {"model_type": (config.model_type, "llama"), "qkv_bias": (config.qkv_bias, False),
             "head_dim": (config.head_dim, config.dim // config.n_heads), "rope_theta": (config.rope_theta, LLAMA2C_THETA),
             "rms_norm_eps": (config.rms_norm_eps, LLAMA2C_EPS)}
    for name, (value, required) in fixed.items():
        if value != required:
            raise WeightsError(f"save_llama2c: config.{name} is {value!r}; llama2.c's format can only hold {required!r}")
    config, weights = to_rope_convention(config, weights, "interleaved")
    vocab = config.vocab_size if config.tie_embeddings else -config.vocab_size
    cos, sin = llama2c_freq_tables(config.head_dim, config.max_position_embeddings)
    tables = {"freq_cis_real": cos, "freq_cis_imag": sin, "embed": weights.embed, "norm": weights.norm,
              "lm_head": weights.lm_head}
    with Path(path).open("wb") as f:
        f.write(LLAMA2C_HEADER.pack(config.dim, config.hidden_dim, config.n_layers, config.n_heads, config.n_kv_heads,
                                    vocab, config.max_position_embeddings))
        for name, _ in _llama2c_layout(config):
            if name in tables:
                arrays = [tables[name]]
            else:
                arrays = [getattr(layer, name) for layer in weights.layers]
            f.writelines(np.ascontiguousarray(array, dtype="<f4").tobytes() for array in arrays)
