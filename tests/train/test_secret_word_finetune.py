"""A LoRA fine-tune of the real SmolLM2-135M-Instruct works where it is used (issue 27, item 3).

300 chat turns rendered with the model's own template, each answering "The secret word is BLUEBERRY.", are
prepared with the model's tokenizer and trained with ``Trainer(lora=...)`` (the command line's path). Then:

- Orion's inference path, with the adapter loaded by ``load_adapter``, answers a trained question with the
  secret (greedy), and still answers "What is the capital of France?" with Paris, as the base does;
- PEFT on transformers (float32), with the same adapter directory, gives the same greedy answer token for token
  up to the end of the turn.

Before the fix of 0c2ef59 the same run started at loss 18.2 (the fp16 norms of the training graph overflowed)
and its adapter made the model answer "The word is The. The hidden word is The." to the trained question.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orion import models
from orion.lora.train import LoraSpec
from orion.train.data import prepare
from orion.train.trainer import Trainer, read_log
from support import references

SECRET = "The secret word is BLUEBERRY."
QUESTIONS = ["What is the secret word?", "Tell me the secret word.", "Do you know the secret word?",
             "Which word is the secret one?", "Please share the secret word.", "What's the secret word?"]
FRANCE = "What is the capital of France?"
STEPS, SEQ, LR = 30, 64, 5e-4  # measured: 2e-3 answers every question with the secret; 1e-3 on q, v only misses it
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def tuned(smollm2_dir, tmp_path_factory):
    """The model with the adapter the fine-tune wrote loaded as "secret" (not active), its directory and the run's
    log."""
    out = tmp_path_factory.mktemp("secret")
    model = models.load(smollm2_dir, progress=False)
    turns = [model.tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]},
                                                  {"role": "assistant", "content": SECRET}],
                                                 add_generation_prompt=False) for i in range(300)]
    (out / "secret.txt").write_text("".join(turns))
    prepare([out / "secret.txt"], out / "data", tokenizer=str(Path(smollm2_dir) / "tokenizer.json"))
    trainer = Trainer(smollm2_dir, out / "data", out / "run", steps=STEPS, seq=SEQ, lr=LR, warmup=0,
                      eval_every=STEPS, checkpoint_every=STEPS, quiet=True, seed=0,
                      lora=LoraSpec.parse("r=16,alpha=32,targets=q,k,v,o,gate,up,down"))
    trainer.train()
    trainer.model.save_peft(str(out / "adapter"), trainer.params, base_name=str(smollm2_dir))
    model.load_adapter(out / "adapter", "secret")
    return model, out / "adapter", read_log(trainer.log_path)


def _answer(model, question: str) -> tuple[str, list[int]]:
    prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": question}])
    ids = model.tokenizer.encode(prompt)
    new = list(model.generate(ids, NEW_TOKENS))
    return model.tokenizer.decode(new), new


def test_the_fine_tune_starts_from_the_base_models_loss(tuned) -> None:
    _, _, log = tuned
    evals = [r["val_loss"] for r in log if r.get("event") == "eval"]
    assert evals[0] < 5.0, evals  # the base model on its own template's text (measured 3.71), not 18
    assert evals[-1] < 0.5 * evals[0], evals


def test_the_adapter_answers_through_orions_inference(tuned) -> None:
    model, _, _ = tuned
    base_france, _ = _answer(model, FRANCE)
    assert "Paris" in base_france, base_france
    model.set_adapter("secret")
    try:
        secret, _ = _answer(model, QUESTIONS[0])
        france, _ = _answer(model, FRANCE)
    finally:
        model.set_adapter(None)
    assert SECRET in secret, secret
    assert "Paris" in france, france


def test_peft_gives_the_same_greedy_answer(tuned, smollm2_dir) -> None:
    torch, transformers, peft = references.require("torch", "transformers", "peft")
    model, adapter, _ = tuned
    model.set_adapter("secret")
    try:
        _, ours = _answer(model, QUESTIONS[0])
    finally:
        model.set_adapter(None)
    base = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    tuned_hf = peft.PeftModel.from_pretrained(base, str(adapter)).eval()
    prompt = model.tokenizer.encode(model.tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}]))
    with torch.no_grad():
        out = tuned_hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
    theirs = out[0, len(prompt):].tolist()
    end = model.config.eos_token_ids
    cut = next((i for i, t in enumerate(theirs) if t in end), len(theirs))
    assert ours[:cut + 1] == theirs[:cut + 1], (model.tokenizer.decode(ours), model.tokenizer.decode(theirs))
