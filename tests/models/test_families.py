"""The families that run on the Llama layer, against transformers on their published ``config.json``
(``support.families``: 2 layers, vocabulary cut to 512, random weights that transformers makes and saves):

- Qwen3-0.6B (per-head q/k RMSNorm, head_dim 128 != 1024 / 16, tied), and with the YaRN scaling its card
  recommends (factor 4; original context cut to 16 so prompts pass it);
- Llama-3.2-1B (llama3 scaling; original context cut to 16);
- SmolLM3-3B (the published pattern's layers 3 and 4: the second skips RoPE);
- Phi-4-mini (fused qkv_proj/gate_up_proj, RoPE on 3/4 of each head, longrope; original context cut to 32, so
  a pass of 24 tokens uses the short factors and one of 40 the long ones).

Orion's logits (fp16 on the emulator) equal transformers' fp32 logits within 1% of the largest |logit|
(measured: 0.07-0.3%) for every prompt length from 1 token to past the original context (the rows of one pass);
its 32 greedy tokens after a prompt past the original context (a prefill, then decode steps) are transformers'
(a step may differ only at a near-tie, within 0.5% of the largest |logit|, and at most 2 steps do). The independent numpy reference
(``support.llama_reference``) reproduces transformers to 1e-4, so the gradient and training tests may use it.
Every published config loads; each family's fields that Orion does not implement are refused by name.
"""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

from orion import models
from orion.models.config_fields import ConfigNote
from orion.models.llama.config import ConfigError, LlamaConfig
from orion.models.llama.weights import load_hf
from support import families, references
from support.llama_reference import reference_logits

torch, transformers = references.require("torch", "transformers")

TOLERANCE, TIE, REFERENCE = 0.01, 0.005, 1e-4
LONG = 40  # tokens: past every case's original context

CASES = {
    "qwen3-0.6b": families.two_layers("qwen3-0.6b"),
    "qwen3-0.6b-yarn": families.two_layers("qwen3-0.6b", rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    "llama-3.2-1b": families.two_layers("llama-3.2-1b", rope_scaling={
        **families.PUBLISHED["llama-3.2-1b"]["rope_scaling"], "original_max_position_embeddings": 16}),
    "smollm3-3b": families.two_layers("smollm3-3b"),
    "phi-4-mini": families.two_layers("phi-4-mini", original_max_position_embeddings=32),
}
BY_LENGTH = {"phi-4-mini"}  # longrope: a pass's tables depend on its length


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf = families.hf_model(CASES[request.param], seed=len(request.param))
    families.save_bf16(hf, directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigNote)  # Phi-4-mini's published file holds fields Phi-3 never reads
        model = models.load(directory, progress=False)
    ids = [int(i) for i in np.random.default_rng(3).integers(0, families.VOCAB, LONG)]
    yield request.param, directory, hf, model, ids
    del hf, model
    gc.collect()  # the programs and both models of one published shape hold ~4 GB: free them before the next


def _close(got: np.ndarray, want: np.ndarray, tolerance: float = TOLERANCE) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * float(np.abs(want).max()))


def test_the_published_features_are_read(case) -> None:
    name, _, _, model, _ = case
    c = model.config
    features = {"qwen3-0.6b": (True, (), 1.0, None), "qwen3-0.6b-yarn": (True, (), 1.0, "yarn"),
                "llama-3.2-1b": (False, (), 1.0, "llama3"), "smollm3-3b": (False, (1,), 1.0, None),
                "phi-4-mini": (False, (), 0.75, "longrope")}[name]
    assert (c.qk_norm, c.no_rope_layers, c.partial_rotary_factor,
            c.rope_scaling and c.rope_scaling.rope_type) == features
    assert c.head_dim == (128 if name.startswith(("qwen3", "phi")) else c.dim // c.n_heads)


def test_logits_match_transformers_from_one_token_to_past_the_original_context(case) -> None:
    name, _, hf, model, ids = case
    for length in (24, LONG) if name in BY_LENGTH else (LONG,):
        # row i of one pass is the prompt of i + 1 tokens (longrope: each pass has its length's factors)
        _close(model.logits(ids[:length]), families.hf_logits(hf, ids[:length]))


def test_greedy_tokens_are_transformers_over_32_steps(case) -> None:
    """From a prompt past the original context: a prefill, then 32 decode steps; transformers' generate (its KV
    cache) gives the tokens, and where they differ every step is checked against its logits given Orion's tokens."""
    _, _, hf, model, ids = case
    prompt = ids[:36]
    got = list(model.generate(prompt, 32, stop=None))
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0)[0, 36:].tolist()
    if got != want:
        ties = references.greedy_follows(lambda seq: families.hf_logits(hf, seq)[-1], prompt, got, TIE)
        assert ties <= 2, (got, want)


def test_the_numpy_reference_is_transformers(case) -> None:
    _, directory, hf, _, ids = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigNote)
        config, weights = load_hf(directory, progress=False)
    _close(reference_logits(config, weights, ids[:24]), families.hf_logits(hf, ids[:24]), REFERENCE)


def test_a_longrope_cache_rotated_short_is_not_continued_past_the_original_context(case) -> None:
    """transformers' Phi-3 recomputes the whole sequence with the long factors when it crosses the original
    context; Orion's cache holds keys rotated with the short ones, so it refuses to decode past it."""
    name, _, _, model, ids = case
    if name not in BY_LENGTH:
        pytest.skip("only longrope's factors depend on the length")
    model.prefill(ids[:30])
    model.decode_step(ids[30])
    model.decode_step(ids[31])  # position 31: a pass over 32 positions, still the short factors
    with pytest.raises(ConfigError, match=r"cross longrope's original_max_position_embeddings \(32\).*Fix: run"):
        model.decode_step(ids[32])


@pytest.mark.parametrize("name", list(families.PUBLISHED))
def test_every_published_config_loads_and_writes_back(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigNote)
        config = LlamaConfig.from_hf_json(families.PUBLISHED[name])
    assert config.n_layers == families.PUBLISHED[name]["num_hidden_layers"]
    assert LlamaConfig.from_hf_json(config.to_hf_json()) == config


def test_published_fields_no_family_reads_are_accepted_with_one_note() -> None:
    with pytest.warns(ConfigNote, match=r"'attention_bias', 'full_attn_mod', 'interpolate_factor', 'lm_head_bias', "
                                        r"'mlp_bias' are not among the fields that change a Phi-3 model") as notes:
        LlamaConfig.from_hf_json(families.PUBLISHED["phi-4-mini"])
    assert len(notes) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LlamaConfig.from_hf_json(families.PUBLISHED["qwen3-0.6b"])
        LlamaConfig.from_hf_json(families.PUBLISHED["llama-3.2-1b"])


@pytest.mark.parametrize("name,changes,match", [
    ("qwen3-0.6b", {"attention_bias": True}, "'attention_bias' is true: Qwen3 with projection biases"),
    ("qwen3-0.6b", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                                     "low_freq_factor": 1.0}}, "rope_scaling.low_freq_factor"),
    ("smollm3-3b", {"no_rope_layers": [1, 0, 1]}, "'no_rope_layers' is .*36 entries of 0 or 1"),
    ("smollm3-3b", {"mlp_bias": True}, "'mlp_bias' is true"),
    ("phi-3.5-mini", {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "'rope_scaling.rope_type' is \"dynamic\": RoPE scaling 'dynamic' in a Phi-3 model"),
    ("llama-3.2-1b", {"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 4.0,
                                       "high_freq_factor": 1.0}}, "high_freq_factor > low_freq_factor"),
])
def test_fields_a_family_does_not_implement_are_refused_by_name(name: str, changes: dict, match: str) -> None:
    with warnings.catch_warnings(), pytest.raises(ConfigError, match=match):
        warnings.simplefilter("ignore", ConfigNote)
        LlamaConfig.from_hf_json(families.PUBLISHED[name] | changes)


@pytest.mark.parametrize("name,changes,window,layers", [
    ("qwen3-0.6b", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}, 4096,
     tuple(range(20, 28))),  # transformers: the layers from max_window_layers on
    ("smollm3-3b", {"use_sliding_window": True, "sliding_window": 4096}, 4096,
     tuple(range(3, 36, 4))),  # transformers: the layers without RoPE (every fourth)
    ("phi-3.5-mini", {"sliding_window": 2047, "max_position_embeddings": 4096, "rope_scaling": None}, 2047,
     None),  # Phi-3-mini-4k's published window: every layer
])
def test_sliding_windows_are_read_as_transformers_applies_them(name: str, changes: dict, window: int,
                                                                layers: tuple[int, ...] | None) -> None:
    """The windows the mechanism of tests/models/test_sliding_window.py then honours (checked there against
    transformers' Mistral and Qwen2): which layers slide, by each family's own fields."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigNote)
        config = LlamaConfig.from_hf_json(families.PUBLISHED[name] | changes)
    assert (config.sliding_window, config.sliding_layers) == (window, layers)
    assert LlamaConfig.from_hf_json(config.to_hf_json()) == config
