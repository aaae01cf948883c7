"""LoRA adapters as program inputs against an independent numpy reference of the merged weights
``W + (alpha / r) B A``, bit-identity of unset and zero adapters, hot swap without compiles, and errors.

Tolerance: logits agree to 3% (GPT-2) / 2% (Llama) of the reference's largest logit magnitude, as the base
models' own tests: Orion computes in fp16 rounded after each op, the reference in float32.
"""

from __future__ import annotations

import copy
import json
import time

import numpy as np
import pytest

import orion
from orion.generation.loop import CausalLM
from orion.lora import AdapterError, LoraAdapter
from orion.models import GPT2, GPT2Config, Llama, LlamaConfig
from orion.models.llama.weights import random_weights, to_rope_convention
from support import gpt2_reference, llama_reference
from support.gpt2_fixtures import lively_weights

GPT2_CONFIG = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=96)
LLAMA_CONFIG = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=160,
                           max_position_embeddings=32, rope_convention="half", tie_embeddings=False)
IDS = [5, 17, 3, 42, 8, 61, 23]
LLAMA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Hugging Face module (relative to one layer) -> Orion weight field, for the reference's own merge
GPT2_FIELDS = {"attn.c_attn": "w_qkv", "attn.c_proj": "w_attn_out", "mlp.c_fc": "w_fc", "mlp.c_proj": "w_proj"}
LLAMA_FIELDS = {"self_attn.q_proj": "wq", "self_attn.k_proj": "wk", "self_attn.v_proj": "wv", "self_attn.o_proj": "wo",
                "mlp.gate_proj": "w_gate", "mlp.up_proj": "w_up", "mlp.down_proj": "w_down"}


def random_adapter(model: CausalLM, r: int, alpha: float, modules: list[str], seed: int, size: float = 0.15,
                   zero_b: bool = False) -> LoraAdapter:
    """A[r, in], B[out, r] of every module path in ``modules`` (shapes from the model's placements)."""
    rng = np.random.default_rng(seed)
    placements = model.lora_placements()
    tensors = {}
    for path in modules:
        p = placements[path]
        a = rng.normal(0, size, (r, p.in_features)).astype(np.float32)
        b = rng.normal(0, size, (p.out_features, r)).astype(np.float32)
        tensors[path] = (a, np.zeros_like(b) if zero_b else b)
    return LoraAdapter(r, alpha, tensors)


def merged(weights, layers_attr: str, fields: dict[str, str], adapter: LoraAdapter, prefix: str):
    """A deep copy of ``weights`` with ``W + (alpha / r) B A`` in every adapted projection (float64 product)."""
    out = copy.deepcopy(weights)
    for i, layer in enumerate(getattr(out, layers_attr)):
        for module, field in fields.items():
            path = f"{prefix}.{i}.{module}"
            if path in adapter.modules:
                a, b = adapter.modules[path]
                w = getattr(layer, field)
                setattr(layer, field, (w + adapter.alpha / adapter.r * (b.astype(np.float64) @ a)).astype(np.float32))
    return out


def close(got: np.ndarray, want: np.ndarray, tolerance: float) -> None:
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * float(np.abs(want).max()))


@pytest.fixture(scope="module")
def gpt2() -> GPT2:
    return GPT2(GPT2_CONFIG, lively_weights(GPT2_CONFIG, seed=3), progress=False)


def gpt2_paths(modules) -> list[str]:
    return [f"transformer.h.{i}.{m}" for i in range(GPT2_CONFIG.n_layer) for m in modules]


def llama_paths(config: LlamaConfig, modules) -> list[str]:
    return [f"model.layers.{i}.self_attn.{m}" if m[0] in "qkvo" else f"model.layers.{i}.mlp.{m}"
            for i in range(config.n_layers) for m in modules]


def test_gpt2_adapter_matches_the_merged_reference(gpt2) -> None:
    adapter = random_adapter(gpt2, 4, 8.0, gpt2_paths(GPT2_FIELDS), seed=1)
    gpt2.add_adapter(adapter, "all4")
    gpt2.set_adapter("all4")
    want = gpt2_reference.reference_logits(GPT2_CONFIG, merged(gpt2.weights, "blocks", GPT2_FIELDS, adapter,
                                                               "transformer.h"), IDS)
    base = gpt2_reference.reference_logits(GPT2_CONFIG, gpt2.weights, IDS)
    assert np.abs(want - base).max() > 0.2 * np.abs(base).max()  # the adapter changes the logits a lot
    close(gpt2.logits(IDS), want, 0.03)
    close(gpt2.prefill(IDS[:4]), want[3], 0.03)  # prefill, then the decode programs with the adapter
    for t in range(4, len(IDS)):
        close(gpt2.decode_step(IDS[t]), want[t], 0.03)
    gpt2.set_adapter(None)


@pytest.mark.parametrize("convention", ["half", "interleaved"])
def test_llama_adapter_matches_the_merged_reference(convention) -> None:
    weights = random_weights(LLAMA_CONFIG, 4)
    for _, array in weights.arrays():
        array *= 10 if array.ndim == 2 else 1
    config, orion_weights = to_rope_convention(LLAMA_CONFIG, weights, convention)
    model = Llama(config, orion_weights, progress=False)
    adapter = random_adapter(model, 3, 12.0, llama_paths(config, LLAMA_MODULES), seed=2, size=0.3)
    model.add_adapter(adapter, "all7")
    model.set_adapter("all7")
    want = llama_reference.reference_logits(LLAMA_CONFIG, merged(weights, "layers", LLAMA_FIELDS, adapter,
                                                                 "model.layers"), IDS)
    base = llama_reference.reference_logits(LLAMA_CONFIG, weights, IDS)
    assert np.abs(want - base).max() > 0.2 * np.abs(base).max()
    close(model.logits(IDS), want, 0.02)
    close(model.prefill(IDS[:3]), want[2], 0.02)
    for t in range(3, len(IDS)):
        close(model.decode_step(IDS[t]), want[t], 0.02)


def run(model: CausalLM) -> list[np.ndarray]:
    """Every output path: all-position logits, prefill and two decode steps."""
    return [model.logits(IDS), model.prefill(IDS[:3]), model.decode_step(IDS[3]), model.decode_step(IDS[4])]


def test_unset_and_zero_adapters_give_the_base_outputs_bit_for_bit(gpt2) -> None:
    gpt2.set_adapter(None)
    base = run(gpt2)
    gpt2.add_adapter(random_adapter(gpt2, 4, 16.0, gpt2_paths(GPT2_FIELDS), seed=5, zero_b=True), "zero")
    gpt2.set_adapter("zero")  # the LoRA programs, with B = 0: every update adds an exact 0
    for got, want in zip(run(gpt2), base, strict=True):
        assert np.array_equal(got, want)
    gpt2.set_adapter(None)
    for got, want in zip(run(gpt2), base, strict=True):
        assert np.array_equal(got, want)


def test_a_zero_llama_adapter_on_every_target_gives_the_base_outputs_bit_for_bit() -> None:
    model = Llama(LLAMA_CONFIG, random_weights(LLAMA_CONFIG, 6), progress=False)
    base = run(model)
    model.add_adapter(random_adapter(model, 2, 4.0, llama_paths(LLAMA_CONFIG, LLAMA_MODULES), seed=7,
                                     zero_b=True), "zero")
    model.set_adapter("zero")
    for got, want in zip(run(model), base, strict=True):
        assert np.array_equal(got, want)


def test_switching_among_three_adapters_compiles_nothing(gpt2, capsys) -> None:
    names = []
    for k, modules in enumerate([["attn.c_attn"], ["attn.c_attn"], ["attn.c_attn", "mlp.c_fc"]]):
        names.append(gpt2.add_adapter(random_adapter(gpt2, 8, 16.0, gpt2_paths(modules), seed=10 + k), f"s{k}"))
    first = {}
    for name in names:  # warm: each variant's prefill bucket compiled once
        gpt2.set_adapter(name)
        first[name] = run(gpt2)
    assert not np.array_equal(first["s0"][0], first["s1"][0])
    before = orion.compile_count()
    start = time.perf_counter()
    for k in range(100):
        gpt2.set_adapter(names[k % 3])
    latency = (time.perf_counter() - start) / 100
    assert orion.compile_count() == before
    for name in reversed(names):  # after 100 switches each adapter still gives its own outputs exactly
        gpt2.set_adapter(name)
        for got, want in zip(run(gpt2), first[name], strict=True):
            assert np.array_equal(got, want)
    assert orion.compile_count() == before
    with capsys.disabled():
        print(f"\n  adapter switch latency: {latency * 1e6:.0f} us (GPT-2 {GPT2_CONFIG.n_layer}x{GPT2_CONFIG.n_embd})")
    gpt2.set_adapter(None)


def test_set_adapter_empties_the_kv_cache(gpt2) -> None:
    gpt2.set_adapter(None)
    gpt2.prefill(IDS[:3])
    gpt2.set_adapter(None)
    assert gpt2.cache.length == 0
    with pytest.raises(orion.OrionError, match="prefilled cache"):
        gpt2.decode_step(IDS[3])


def test_a_fork_keeps_its_own_active_adapter(gpt2) -> None:
    gpt2.add_adapter(random_adapter(gpt2, 2, 4.0, gpt2_paths(["mlp.c_proj"]), seed=30), "fork_me")
    gpt2.set_adapter("fork_me")
    want = gpt2.logits(IDS)
    twin = gpt2.fork()
    gpt2.set_adapter(None)
    assert np.array_equal(twin.logits(IDS), want)
    assert not np.array_equal(gpt2.logits(IDS), want)


def save(tmp_path, model: CausalLM, adapter: LoraAdapter, name: str):
    model.add_adapter(adapter, name)
    model.save_adapter(tmp_path / name, name)
    return tmp_path / name


def test_save_and_load_round_trip_in_orion(gpt2, tmp_path) -> None:
    path = save(tmp_path, gpt2, random_adapter(gpt2, 4, 8.0, gpt2_paths(["attn.c_proj"]), seed=40), "proj_only")
    config = json.loads((path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["fan_in_fan_out"]) == (4, 8.0, True)
    assert config["target_modules"] == ["attn.c_proj"]  # "c_proj" alone would also select mlp.c_proj
    gpt2.set_adapter("proj_only")
    want = gpt2.logits(IDS)
    assert gpt2.load_adapter(path, "again") == "again"
    gpt2.set_adapter("again")
    assert np.array_equal(gpt2.logits(IDS), want)
    gpt2.set_adapter(None)


def test_mismatches_are_clear_errors(gpt2, tmp_path) -> None:
    path = save(tmp_path, gpt2, random_adapter(gpt2, 4, 8.0, gpt2_paths(["attn.c_attn"]), seed=50), "good")
    config = json.loads((path / "adapter_config.json").read_text())

    def broken(**changes):
        (path / "adapter_config.json").write_text(json.dumps(config | changes))
        return path

    with pytest.raises(AdapterError, match=r"module 'transformer.h.0.attn.c_attn': lora_A is \[4, 64\].*\[8, 64\]"):
        gpt2.load_adapter(broken(r=8), "rank")
    with pytest.raises(AdapterError, match="target module 'q_proj' is no linear of this model"):
        gpt2.load_adapter(broken(target_modules=["q_proj"]), "target")
    with pytest.raises(AdapterError, match="use_dora"):
        gpt2.load_adapter(broken(use_dora=True), "dora")
    wide = GPT2.random(GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=96), progress=False)
    with pytest.raises(AdapterError, match=r"lora_A is \[4, 64\] and lora_B \[192, 4\], this model needs \[4, 32\] "
                                           r"and \[96, 4\]"):
        wide.load_adapter(broken(), "wrong_base")
    llama = Llama(LLAMA_CONFIG, random_weights(LLAMA_CONFIG, 0), progress=False)
    with pytest.raises(AdapterError, match="module 'transformer.h.0.attn.c_attn' is not a linear this model"):
        llama.add_adapter(random_adapter(gpt2, 4, 8.0, gpt2_paths(["attn.c_attn"]), seed=1), "gpt2_on_llama")
    with pytest.raises(AdapterError, match="no adapter named 'nope'"):
        gpt2.set_adapter("nope")
    with pytest.raises(AdapterError, match="loaded already"):
        gpt2.add_adapter(random_adapter(gpt2, 4, 8.0, gpt2_paths(["attn.c_attn"]), seed=1), "good")
    with pytest.raises(AdapterError, match="adapter_config.json: not found"):
        gpt2.load_adapter(tmp_path / "missing")
    assert gpt2.active_adapter is None  # nothing above changed the model
