"""GGUF metadata and tensors -> Orion's configs and float32 weights, per llama.cpp architecture.

Each reader takes the metadata keys that change its model and refuses, by name, the ones it does not
implement, and it expects exactly the tensors its config implies (an extra tensor would be a part of
the model left out)."""

from __future__ import annotations

import numpy as np

from orion.errors import OrionError
from orion.models.gguf.reader import GGUFError, GGUFFile
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.weights import BlockWeights, GPT2Weights
from orion.models.llama.config import LlamaConfig
from orion.models.llama.weights import LayerWeights, LlamaWeights, expected_shapes, interleaved_rows

# GGUF name under "blk.N." -> Orion's LayerWeights field.
_LLAMA_LAYER = {"attn_norm.weight": "attn_norm", "attn_q.weight": "wq", "attn_k.weight": "wk",
                "attn_v.weight": "wv", "attn_output.weight": "wo", "ffn_norm.weight": "mlp_norm",
                "ffn_gate.weight": "w_gate", "ffn_up.weight": "w_up", "ffn_down.weight": "w_down"}
_QKV_BIASES = {"attn_q.bias": "bq", "attn_k.bias": "bk", "attn_v.bias": "bv"}
# GGUF name under "blk.N." -> GPT-2's BlockWeights field (projections are [out, in] in both).
_GPT2_BLOCK = {"attn_norm.weight": "ln1_g", "attn_norm.bias": "ln1_b", "attn_qkv.weight": "w_qkv",
               "attn_qkv.bias": "b_qkv", "attn_output.weight": "w_attn_out", "attn_output.bias": "b_attn_out",
               "ffn_norm.weight": "ln2_g", "ffn_norm.bias": "ln2_b", "ffn_up.weight": "w_fc", "ffn_up.bias": "b_fc",
               "ffn_down.weight": "w_proj", "ffn_down.bias": "b_proj"}
_KNOWN_EXTRAS = {"rope_freqs.weight": "Llama 3's RoPE frequency scaling (rope_freqs)"}


def read_llama(file: GGUFFile) -> tuple[LlamaConfig, LlamaWeights]:
    """A ``llama`` (Llama, Mistral, SmolLM, TinyLlama: q/k rows in interleaved-RoPE order) or ``qwen2``
    (rotate-half order, q/k/v biases) file as a rotate-half Llama-family config and weights."""
    dim = file.arch("embedding_length", int)
    heads = file.arch("attention.head_count", int)
    head_dim = file.arch("attention.key_length", int, dim // heads if heads else 0)
    if file.arch("attention.value_length", int, head_dim) != head_dim:
        raise GGUFError(f"{file.path}: {file.architecture}.attention.value_length differs from key_length "
                        f"({head_dim}); Orion's attention needs them equal")
    _refuse_unimplemented(file, head_dim)
    vocab = file.shape("token_embd.weight")[0] if file.has("token_embd.weight") else 0
    qwen2 = file.architecture == "qwen2"
    try:
        config = LlamaConfig(
            dim=dim, n_layers=file.arch("block_count", int), n_heads=heads,
            n_kv_heads=file.arch("attention.head_count_kv", int, heads), head_dim=head_dim,
            hidden_dim=file.arch("feed_forward_length", int), vocab_size=vocab,
            max_position_embeddings=file.arch("context_length", int),
            rms_norm_eps=file.arch("attention.layer_norm_rms_epsilon", float),
            rope_theta=file.arch("rope.freq_base", float, 10000.0),
            rope_convention="half", tie_embeddings=not file.has("output.weight"),
            qkv_bias=qwen2, model_type="qwen2" if qwen2 else "llama",
            bos_token_id=file.get("tokenizer.ggml.bos_token_id", int, None),
            eos_token_ids=tuple(i for i in (file.get("tokenizer.ggml.eos_token_id", int, None),) if i is not None))
    except OrionError as err:
        raise GGUFError(f"{file.path}: its {file.architecture}.* metadata is not a valid model: {err}") from None
    shapes = expected_shapes(config)
    names = {"token_embd.weight", "output_norm.weight"} | (set() if config.tie_embeddings else {"output.weight"})
    layer_fields = {**_LLAMA_LAYER, **(_QKV_BIASES if qwen2 else {})}
    names |= {f"blk.{i}.{name}" for i in range(config.n_layers) for name in layer_fields}
    _check_tensor_names(file, names)
    # llama.cpp's interleaved q/k rows are read in rotate-half order (as to_rope_convention permutes them)
    row_orders = {} if qwen2 else {f"blk.{i}.{name}": interleaved_rows(heads, config.head_dim)
                                   for i in range(config.n_layers)
                                   for name, heads in (("attn_q.weight", config.n_heads),
                                                       ("attn_k.weight", config.n_kv_heads))}
    file.prepare_tensors(row_orders)
    layers = [LayerWeights(**{ours: file.float32(f"blk.{i}.{name}", shapes[ours]) for name, ours in layer_fields.items()})
              for i in range(config.n_layers)]
    return config, LlamaWeights(embed=file.float32("token_embd.weight", shapes["embed"]),
                                norm=file.float32("output_norm.weight", shapes["norm"]), layers=layers,
                                lm_head=None if config.tie_embeddings else file.float32("output.weight", shapes["lm_head"]))


def read_gpt2(file: GGUFFile) -> tuple[GPT2Config, GPT2Weights]:
    """A ``gpt2`` file as a GPT-2 config and weights; its ``output.weight``, a copy of the embedding that
    llama.cpp's converter writes, must equal the embedding up to quantization (Orion's GPT-2 ties them)."""
    c = file.arch("embedding_length", int)
    inner = file.arch("feed_forward_length", int)
    try:
        config = GPT2Config(n_layer=file.arch("block_count", int), n_head=file.arch("attention.head_count", int),
                            n_embd=c, vocab_size=file.shape("token_embd.weight")[0] if file.has("token_embd.weight") else 0,
                            n_positions=file.arch("context_length", int),
                            layer_norm_epsilon=file.arch("attention.layer_norm_epsilon", float),
                            n_inner=None if inner == 4 * c else inner)
    except OrionError as err:
        raise GGUFError(f"{file.path}: its gpt2.* metadata is not a valid GPT-2: {err}") from None
    f, v = config.inner, config.vocab_size
    shapes = {"ln1_g": (c,), "ln1_b": (c,), "w_qkv": (3 * c, c), "b_qkv": (3 * c,), "w_attn_out": (c, c),
              "b_attn_out": (c,), "ln2_g": (c,), "ln2_b": (c,), "w_fc": (f, c), "b_fc": (f,), "w_proj": (c, f),
              "b_proj": (c,)}
    names = {"token_embd.weight", "position_embd.weight", "output_norm.weight", "output_norm.bias", "output.weight"}
    names |= {f"blk.{i}.{name}" for i in range(config.n_layer) for name in _GPT2_BLOCK}
    _check_tensor_names(file, names, optional={"output.weight"})
    file.prepare_tensors()
    wte = file.float32("token_embd.weight", (v, c))
    if file.has("output.weight"):
        head = file.float32("output.weight", (v, c))
        if not np.allclose(head, wte, rtol=0, atol=0.05 * float(np.abs(wte).max())):
            raise GGUFError(f"{file.path}: output.weight differs from token_embd.weight beyond quantization; "
                            "Orion's GPT-2 ties its LM head to the embedding")
    blocks = [BlockWeights(**{ours: file.float32(f"blk.{i}.{name}", shapes[ours]) for name, ours in _GPT2_BLOCK.items()})
              for i in range(config.n_layer)]
    return config, GPT2Weights(wte=wte, wpe=file.float32("position_embd.weight", (config.n_positions, c)),
                               ln_f_g=file.float32("output_norm.weight", (c,)),
                               ln_f_b=file.float32("output_norm.bias", (c,)), blocks=blocks)


def _refuse_unimplemented(file: GGUFFile, head_dim: int) -> None:
    """Metadata that changes a Llama-family model and that Orion does not implement, refused by name."""
    scaling = file.arch("rope.scaling.type", str, "none")
    if scaling != "none" or file.arch("rope.scaling.factor", float, 1.0) not in (0.0, 1.0):
        raise _unimplemented(file, "rope.scaling.type", scaling, "RoPE scaling")
    rotated = file.arch("rope.dimension_count", int, head_dim)
    if rotated != head_dim:
        raise _unimplemented(file, "rope.dimension_count", rotated, f"RoPE on {rotated} of {head_dim} channels")
    for key, what in (("expert_count", "mixture of experts"), ("attention.sliding_window", "sliding-window attention")):
        value = file.arch(key, int, 0)
        if value and not (key == "attention.sliding_window" and value >= file.arch("context_length", int)):
            raise _unimplemented(file, key, value, what)


def _unimplemented(file: GGUFFile, key: str, value: object, what: str) -> GGUFError:
    return GGUFError(f"{file.path}: metadata '{file.architecture}.{key}' is {value!r}: {what} is not implemented "
                     "by Orion (it never ignores what changes the model)")


def _check_tensor_names(file: GGUFFile, expected: set[str], optional: frozenset[str] | set[str] = frozenset()) -> None:
    missing = sorted(expected - set(file.tensors) - set(optional))
    if missing:
        raise GGUFError(f"{file.path}: missing tensor {missing[0]!r}" + (f" and {len(missing) - 1} more" if len(missing) > 1
                                                                          else "")
                        + f" that its {file.architecture}.* metadata implies")
    extra = sorted(set(file.tensors) - expected)
    if extra:
        what = _KNOWN_EXTRAS.get(extra[0], "a part of the model Orion's " + file.architecture + " does not have")
        raise GGUFError(f"{file.path}: tensor {extra[0]!r} ({what}) is not implemented by Orion"
                        + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))

