"""PEFT round trip through the reference extra: adapters made with ``peft`` on tiny GPT-2 and Llama models
(saved by transformers + peft) give the same logits in Orion as in transformers + peft, and adapters saved by
Orion load back into peft with the same logits.

Tolerance: 3% (GPT-2) / 2% (Llama) of the largest logit magnitude, as the base models' own tests (Orion runs
in fp16, torch in float32); Orion's saved adapter reloaded in peft must match peft on the original exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from orion import models
from support import references

torch, transformers, peft = references.require("torch", "transformers", "peft")

IDS = [int(i) for i in np.random.default_rng(7).integers(0, 96, 12)]
SHAPES = {
    "gpt2": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=96)), ["c_attn", "c_proj", "c_fc"], 0.03),
    "gpt2-rslora": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(  # scale alpha / sqrt(r)
        n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=96)), ["c_attn", "c_fc"], 0.03),
    "llama": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=32, rope_theta=500.0, tie_word_embeddings=False)),
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 0.02),
}


def hf_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].float().numpy()


def close(got: np.ndarray, want: np.ndarray, tolerance: float) -> None:
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * float(np.abs(want).max()))


@pytest.mark.parametrize("kind", list(SHAPES))
def test_peft_adapter_in_orion_and_orion_adapter_in_peft(tmp_path, kind) -> None:
    make, targets, tolerance = SHAPES[kind]
    torch.manual_seed(3)
    base = make().eval()
    with torch.no_grad():  # lively weights: every parameter matters
        for p in base.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.08))
    base.save_pretrained(tmp_path / "base")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False,
                             fan_in_fan_out=kind.startswith("gpt2"), use_rslora=kind.endswith("rslora"),
                             task_type="CAUSAL_LM")
    tuned = peft.get_peft_model(base, config).eval()  # init_lora_weights=False: random A and B, a visible update
    tuned.save_pretrained(tmp_path / "peft")
    want = hf_logits(tuned)
    base_logits = hf_logits(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval())
    assert np.abs(want - base_logits).max() > 0.1 * np.abs(base_logits).max()

    orion_model = models.load(tmp_path / "base", progress=False)
    name = orion_model.load_adapter(tmp_path / "peft")
    orion_model.set_adapter(name)
    close(orion_model.logits(IDS), want, tolerance)
    close(orion_model.prefill(IDS[:5]), want[4], tolerance)
    close(orion_model.decode_step(IDS[5]), want[5], tolerance)

    orion_model.save_adapter(tmp_path / "orion", name)
    fresh = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "orion").eval()
    assert np.array_equal(hf_logits(reloaded), want)
