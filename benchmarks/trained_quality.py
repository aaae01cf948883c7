"""Weight-precision quality on a model Orion trained itself: a small Llama trained from scratch on 36 of
Shakespeare's plays, then scored on the held-out Hamlet at each precision (``benchmarks/perplexity.py --model``).

The quality figures of docs/quantization.md use the real SmolLM2-135M-Instruct, whose only weights here are
Q4_1: every block of 32 inputs of a row already sits on a 16-level grid of its own, which a LUT of 16 entries
for 8 whole rows cannot hold. A model trained here in fp32 has weights no quantizer has touched, so its
figures separate a mode's own loss from that mismatch. Macbeth is held out too: it is the importance matrices'
calibration text.

Each step runs in a process of its own and is skipped when its output is already in ``--workdir``:
1. the plays' text -> ``python -m orion data prepare`` (a byte-level BPE of ``--vocab`` tokens);
2. a randomly initialised Llama of that vocabulary (``--dim``, ``--layers``), a Hugging Face directory with the
   data's tokenizer;
3. ``python -m orion train --from-scratch`` for ``--steps`` steps of ``--batch`` windows of 256 tokens; the run
   ends by writing ``RUN/model``;
4. ``benchmarks/perplexity.py --model RUN/model --modes ...`` on Hamlet.

    python benchmarks/trained_quality.py --workdir DIR [--steps 500] [--modes fp16,int8,lut6,lut4,...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from orion.models.llama import weights as llama_weights  # noqa: E402
from orion.models.llama.config import LlamaConfig  # noqa: E402
from support.english_text import training_plays  # noqa: E402

HERE = Path(__file__).resolve().parent


def run(args: list[str]) -> None:
    print("$", " ".join(args), flush=True)
    subprocess.run(args, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True, help="text, data, model and run directories (steps done are kept)")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--modes", default="fp16,int8,lut6,lut6+imatrix,lut4,lut4+imatrix,int4")
    p.add_argument("--windows", type=int, default=220, help="Hamlet windows of 256 tokens scored (default 220: all of it)")
    args = p.parse_args()
    work = Path(args.workdir)
    text, data, base, out = work / "text", work / "data", work / "init", work / "run"
    if not (data / "meta.json").is_file():
        text.mkdir(parents=True, exist_ok=True)
        for member, play in training_plays().items():
            (text / (Path(member).stem + ".txt")).write_text(play)
        run([sys.executable, "-m", "orion", "data", "prepare", *map(str, sorted(text.glob("*.txt"))), "--out",
             str(data), "--vocab-size", str(args.vocab), "--val-fraction", "0.05"])
    if not (base / "config.json").is_file():
        heads = args.dim // 32
        config = LlamaConfig(dim=args.dim, n_layers=args.layers, n_heads=heads, n_kv_heads=max(1, heads // 2),
                             head_dim=32, hidden_dim=3 * args.dim, vocab_size=args.vocab, max_position_embeddings=512,
                             tie_embeddings=True)
        llama_weights.save_hf(base, config, llama_weights.random_weights(config, seed=0))
        (base / "tokenizer.json").write_bytes((data / "tokenizer.json").read_bytes())
    if not (out / "model" / "config.json").is_file():
        run([sys.executable, "-m", "orion", "train", "--model", str(base), "--data", str(data), "--out", str(out),
             "--steps", str(args.steps), "--batch", str(args.batch), "--seq", "256", "--lr", str(args.lr),
             "--from-scratch", "--resume", "--eval-every", "100", "--checkpoint-every", "100"])
    run([sys.executable, str(HERE / "perplexity.py"), "--model", str(out / "model"), "--modes", args.modes,
         "--windows", str(args.windows)])


if __name__ == "__main__":
    main()
