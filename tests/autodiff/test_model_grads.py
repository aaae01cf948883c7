"""Whole-model gradients of tiny GPT-2 and Llama models through the planned programs (fp16 on the emulator,
fp32 head on the CPU) against two independent references:

- central finite differences of the independent numpy models (``support.gpt2_reference``,
  ``support.llama_reference``) along the gradient direction and a random direction: they agree with
  the directional derivative within 2% of the gradient norm;
- torch autograd on transformers' models loaded from the same weights: cosine >= 0.999 per tensor (tensors
  whose true gradient is zero, such as GPT-2's key bias, are checked by norm instead: below 1e-5 of the
  largest tensor's norm).

The models cover every family the trainer trains through the one layer definition it shares with inference:
GPT-2 as published and with transformers' other options (ReLU, an MLP width other than 4 * n_embd,
unscaled scores divided by the layer index), Llama (also with YaRN), Mistral, Qwen2 with q/k/v biases and 3 query
heads per KV head, Qwen3 (per-head q/k norms, head_dim 32 != 64 / 4), SmolLM3 (its second layer without RoPE) and
Phi-3 (fused checkpoint, longrope on half of each head); Mistral with a sliding window of 8 in every layer and Qwen2
with one in layer 1; and Gemma 2 (soft-capping, a sliding window of 8 in layer 0) and Gemma 3 (q/k norms, local and
global RoPE, a sliding window of 8 in layer 0) with norm weights w away from 0 (gains 1 + w).
"""

from __future__ import annotations

import numpy as np
import pytest

from orion import models
from orion.autodiff.runner import GradientRunner
from orion.models.gemma import weights as gemma_weights
from orion.models.gemma.config import GemmaConfig
from orion.models.gemma.trainable import GemmaTrainable
from orion.models.gpt2 import weights as gpt2_weights
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.trainable import GPT2Trainable
from orion.models.llama import weights as llama_weights
from orion.models.llama.config import LlamaConfig
from orion.models.llama.rope import RopeScaling
from orion.models.llama.trainable import LlamaTrainable
from support import gemma_reference, gpt2_reference, llama_reference, references

SEQ = 32


def _gpt2(**options) -> tuple[GPT2Trainable, dict[str, np.ndarray]]:
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=96, n_positions=SEQ, **options)
    model = GPT2Trainable(config)
    params = model.params(gpt2_weights.random_weights(config, seed=3))
    rng = np.random.default_rng(3)
    for name in params:  # non-trivial norms and biases, so their gradients are tested too
        if name.endswith(("_g", "_b")) or ".b_" in name:
            params[name] = params[name] + rng.uniform(-0.3, 0.3, params[name].shape).astype(np.float32)
    return model, params


def _llama(**options) -> tuple[LlamaTrainable, dict[str, np.ndarray]]:
    shape = {"n_heads": 4, "n_kv_heads": 2, "head_dim": 16} | options
    config = LlamaConfig(dim=64, n_layers=2, hidden_dim=96, vocab_size=80, max_position_embeddings=SEQ, **shape)
    model = LlamaTrainable(config)
    params = model.params(llama_weights.random_weights(config, seed=4))
    rng = np.random.default_rng(4)
    for name in params:  # gains away from 1: a wrong RMSNorm backward is invisible at 1; biases away from 0
        if name.endswith("norm"):
            params[name] = rng.uniform(0.5, 1.5, params[name].shape).astype(np.float32)
        elif name.split(".")[-1].startswith("b"):
            params[name] = rng.uniform(-0.3, 0.3, params[name].shape).astype(np.float32)
    return model, params


# Phi-3's longrope on half of each head (4 channel pairs), its original context below the window: the long factors
LONGROPE = RopeScaling("longrope", original_max_position_embeddings=16, short_factor=(1.0, 1.1, 1.3, 2.0),
                       long_factor=(1.0, 2.0, 4.0, 9.0))
def _gemma(**options) -> tuple[GemmaTrainable, dict[str, np.ndarray]]:
    shape = {"n_heads": 4, "n_kv_heads": 2, "head_dim": 16} | options
    config = GemmaConfig(dim=64, n_layers=2, hidden_dim=96, vocab_size=80, max_position_embeddings=SEQ,
                         sliding_window=8, sliding_layers=(0,), query_pre_attn_scalar=24, **shape)
    model = GemmaTrainable(config)
    params = model.params(gemma_weights.random_weights(config, seed=4))
    rng = np.random.default_rng(4)
    for name in params:  # norm weights w away from 0 (gains 1 + w away from 1)
        if name.endswith("norm"):
            params[name] = rng.uniform(-0.5, 0.5, params[name].shape).astype(np.float32)
    return model, params


MODELS = {
    "gpt2": _gpt2,
    "gpt2-relu-wide-unscaled": lambda: _gpt2(activation_function="relu", n_inner=80, scale_attn_weights=False,
                                             scale_attn_by_inverse_layer_idx=True),
    "llama": _llama,
    "mistral": lambda: _llama(model_type="mistral", n_heads=8, n_kv_heads=2, head_dim=8),
    "qwen2-bias": lambda: _llama(model_type="qwen2", qkv_bias=True, n_heads=6, n_kv_heads=2, head_dim=16,
                                 rope_theta=1e6, tie_embeddings=True),
    "qwen3-qk-norm": lambda: _llama(model_type="qwen3", qk_norm=True, head_dim=32, rope_theta=1e6, tie_embeddings=True),
    "smollm3-no-rope-layer": lambda: _llama(model_type="smollm3", no_rope_layers=(1,), tie_embeddings=True),
    "phi3-fused-partial-longrope": lambda: _llama(model_type="phi3", partial_rotary_factor=0.5, rope_scaling=LONGROPE),
    "llama-yarn": lambda: _llama(rope_scaling=RopeScaling("yarn", factor=4.0, original_max_position_embeddings=8)),
    "mistral-window": lambda: _llama(model_type="mistral", sliding_window=8),  # every layer slides
    "qwen2-window": lambda: _llama(model_type="qwen2", qkv_bias=True, sliding_window=8, sliding_layers=(1,)),
    "gemma2": lambda: _gemma(attn_softcap=50.0, final_softcap=30.0),
    # head_dim 32: a q/k norm's gradient [head_dim] makes the 32 lanes an ANE output needs (Gemma 3 1B's is 256)
    "gemma3": lambda: _gemma(model_type="gemma3_text", qk_norm=True, rope_theta=1e6, rope_local_theta=1e4,
                             head_dim=32),
}
REFERENCES = {"gpt2": gpt2_reference, "gemma": gemma_reference}
# Where the layer programs run: the ANE's fp16 programs (the emulator), or "cpu", the same forward and
# gradient graphs evaluated in fp32. The GPT-2 with transformers' other options is checked in fp32: its
# layer-1 q/k gradients are ~1e-4 of the largest tensor's (near-uniform attention at GPT-2's init), below
# what fp16's attention backward resolves to a cosine of 0.999 (0.985 measured; the published GPT-2's are
# ~1e-5 of the largest and exempt by the norm rule below). What it checks is that the network is
# transformers', and that needs no fp16.
PLACEMENT = {"gpt2-relu-wide-unscaled": "cpu"}


def _batch(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, vocab, SEQ + 1)
    return tokens[:-1], tokens[1:]


def _reference_loss(kind: str, model, params: dict[str, np.ndarray], ids, targets) -> float:
    ref = next((r for prefix, r in REFERENCES.items() if kind.startswith(prefix)), llama_reference)
    logits = ref.reference_logits(model.config, model.weights(params), ids).astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -float(log_probs[np.arange(len(targets)), targets].mean())


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    model, params = MODELS[request.param]()
    ids, targets = _batch(model.vocab_size)
    placement = PLACEMENT.get(request.param, "ane")
    runner = GradientRunner(model, SEQ, prefer=placement)
    assert all(p.device == placement for p in runner.plan.programs), str(runner.plan)
    loss, grads = runner.loss_and_grads(params, ids, targets, loss_scale=256.0)
    return request.param, model, params, ids, targets, loss, grads


def test_loss_matches_the_reference(case) -> None:
    kind, model, params, ids, targets, loss, _ = case
    assert loss == pytest.approx(_reference_loss(kind, model, params, ids, targets), rel=2e-3)


def test_finite_differences_of_the_independent_reference(case) -> None:
    kind, model, params, ids, targets, _, grads = case
    names = sorted(params)
    flat = np.concatenate([grads[n].ravel() for n in names]).astype(np.float64)
    norm = np.linalg.norm(flat)
    rng = np.random.default_rng(5)
    for direction in (flat / norm, rng.standard_normal(flat.size) / np.sqrt(flat.size)):
        eps, offset, moved = 1e-2, 0, ({}, {})
        for n in names:
            step = direction[offset:offset + params[n].size].reshape(params[n].shape)
            offset += params[n].size
            moved[0][n], moved[1][n] = params[n] + eps * step, params[n] - eps * step
        fd = (_reference_loss(kind, model, moved[0], ids, targets)
              - _reference_loss(kind, model, moved[1], ids, targets)) / (2 * eps)
        assert abs(fd - flat @ direction) <= 0.02 * norm, (fd, flat @ direction, norm)


def _torch_grads(kind: str, model, params: dict[str, np.ndarray], ids, targets, tmp_path) -> dict[str, np.ndarray]:
    """Gradients by torch autograd on transformers' model, read back through Orion's own loader."""
    torch, transformers = references.require("torch", "transformers")
    module = models.family_of(model.config).weights
    module.save_hf(tmp_path / "model", model.config, model.weights(params))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32,
                                                           attn_implementation="eager")
    logits = hf(torch.tensor(ids)[None]).logits[0]
    torch.nn.functional.cross_entropy(logits, torch.tensor(targets)).backward()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(p.grad)
    hf.save_pretrained(tmp_path / "grads")
    _, grad_weights = module.load_hf(tmp_path / "grads", progress=False)
    return model.params(grad_weights)


def test_gradients_match_torch_autograd(case, tmp_path) -> None:
    kind, model, params, ids, targets, _, grads = case
    want = _torch_grads(kind, model, params, ids, targets, tmp_path)
    assert sorted(want) == sorted(grads)
    largest = max(np.linalg.norm(w) for w in want.values())
    for name, w in want.items():
        got = grads[name].astype(np.float64).ravel()
        w = w.astype(np.float64).ravel()
        if np.linalg.norm(w) < 1e-5 * largest:
            assert np.linalg.norm(got) < 1e-5 * largest, name
            continue
        cosine = got @ w / (np.linalg.norm(got) * np.linalg.norm(w))
        assert cosine >= 0.999, (name, cosine)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gemma2"])
def test_a_frozen_head_gives_the_same_loss_and_input_gradient_and_no_parameter_gradients(kind) -> None:
    model, params = MODELS[kind]()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((SEQ, model.dim)).astype(np.float32)
    _, targets = _batch(model.vocab_size)
    loss, dx, grads = model.head(params, x, targets)
    frozen_loss, frozen_dx, frozen_grads = model.head(params, x, targets, frozen=True)
    assert grads and frozen_grads == {}
    assert frozen_loss == loss and np.array_equal(frozen_dx, dx)
