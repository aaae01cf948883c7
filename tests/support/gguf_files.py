"""GGUF files written from Hugging Face directories the way llama.cpp's convert_hf_to_gguf.py lays
them out (its tensor names, the per-head q/k row permutation of ``llama`` models, GPT-2's Conv1D
weights transposed, its metadata keys and tokenizer keys), quantized with the gguf package.

Only the test's own converter: whether it lays the file out as llama.cpp does is checked by reading
it back with transformers' independent GGUF loader (a float32 file must give the original model)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

LLAMA_NAMES = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
               "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.weight": "attn_output.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
GPT2_NAMES = {"ln_1.weight": "attn_norm.weight", "ln_1.bias": "attn_norm.bias", "attn.c_attn.weight": "attn_qkv.weight",
              "attn.c_attn.bias": "attn_qkv.bias", "attn.c_proj.weight": "attn_output.weight",
              "attn.c_proj.bias": "attn_output.bias", "ln_2.weight": "ffn_norm.weight", "ln_2.bias": "ffn_norm.bias",
              "mlp.c_fc.weight": "ffn_up.weight", "mlp.c_fc.bias": "ffn_up.bias", "mlp.c_proj.weight": "ffn_down.weight",
              "mlp.c_proj.bias": "ffn_down.bias"}


def llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's ``LlamaModel.permute``: each head's rotate-half rows into interleaved pairs."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _tensors(directory: Path, config: dict) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (numpy order) for a GPT-2 or Llama-family directory."""
    hf = {k: v.astype(np.float32) for k, v in load_file(str(directory / "model.safetensors")).items()}
    out: dict[str, np.ndarray] = {}
    if config["model_type"] == "gpt2":
        for name, array in hf.items():
            name = name.removeprefix("transformer.")
            if name.startswith("h."):
                _, layer, rest = name.split(".", 2)
                if rest in GPT2_NAMES:
                    out[f"blk.{layer}.{GPT2_NAMES[rest]}"] = array.T.copy() if array.ndim == 2 else array
            elif name in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
                out[{"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
                     "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}[name]] = array
        out["output.weight"] = out["token_embd.weight"]  # llama.cpp writes GPT-2's tied head as a copy
        return out
    permute = config["model_type"] in ("llama", "mistral")
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    for name, array in hf.items():
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            if permute and rest == "self_attn.q_proj.weight":
                array = llama_cpp_permute(array, heads)
            elif permute and rest == "self_attn.k_proj.weight":
                array = llama_cpp_permute(array, kv_heads)
            out[f"blk.{layer}.{LLAMA_NAMES[rest]}"] = array
        else:
            out[{"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}[name]] = array
    if config.get("tie_word_embeddings"):
        out.pop("output.weight", None)
    return out


def write_gguf(directory: Path, path: Path, qtype: str = "F32", chat_template: str | None = None,
               pre: str = "gpt-2", extra: dict | None = None) -> Path:
    """``directory`` (a transformers-saved model with a byte-level BPE ``tokenizer.json``) as GGUF file
    ``path``; 2-D weights stored as ``qtype`` (norms, biases and 1-D tensors stay F32)."""
    import gguf

    config = json.loads((directory / "config.json").read_text())
    arch = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "qwen2"}[config["model_type"]]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.get("num_hidden_layers", config.get("n_layer")))
    if arch == "gpt2":
        writer.add_context_length(config["n_positions"])
        writer.add_embedding_length(config["n_embd"])
        writer.add_feed_forward_length(config.get("n_inner") or 4 * config["n_embd"])
        writer.add_head_count(config["n_head"])
        writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    else:
        writer.add_context_length(config["max_position_embeddings"])
        writer.add_embedding_length(config["hidden_size"])
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_head_count(config["num_attention_heads"])
        writer.add_head_count_kv(config["num_key_value_heads"])
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
        rope = config.get("rope_parameters") or {}
        writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        writer.add_rope_dimension_count(head_dim)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    for key, value in (extra or {}).items():
        writer.add_key_value(key, value, gguf.GGUFValueType.STRING if isinstance(value, str) else
                             gguf.GGUFValueType.FLOAT32 if isinstance(value, float) else gguf.GGUFValueType.UINT32)
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    vocab = dict(tokenizer["model"]["vocab"])
    for added in tokenizer.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = sorted(vocab, key=vocab.get)
    special = {a["content"] for a in tokenizer.get("added_tokens", []) if a.get("special")}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 4 if t not in tokenizer["model"]["vocab"] else 1 for t in tokens])
    merges = tokenizer["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    eos = vocab["<|endoftext|>"]
    writer.add_bos_token_id(eos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    quant = gguf.GGMLQuantizationType[qtype]
    for name, array in _tensors(directory, config).items():
        if array.ndim == 2 and quant != gguf.GGMLQuantizationType.F32:
            if quant == gguf.GGMLQuantizationType.F16:
                writer.add_tensor(name, array.astype(np.float16))
            else:
                writer.add_tensor(name, gguf.quants.quantize(array, quant), raw_dtype=quant)
        else:
            writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
