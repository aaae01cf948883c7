"""``python -m orion lora merge BASE ADAPTER OUT``: fold a PEFT LoRA adapter into its base model.

BASE is what ``python -m orion train --model`` takes (a Hugging Face directory of any family Orion runs, a shape name with
``--seed``, or a full trainer checkpoint); OUT becomes a Hugging Face directory (``config.json`` +
``model.safetensors``, float32, via the models' ``save_hf``) with every adapted weight ``W + scale * B A``
(``scale = alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA) and every other tensor the base's. The tokenizer
files of a base directory are copied along.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from orion.cli import report_errors
from orion.lora.train import merge, read_adapter

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orion lora", description="LoRA adapters on the command line.")
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    m = commands.add_parser("merge", help="write BASE with ADAPTER folded in as a Hugging Face directory OUT")
    m.add_argument("base", help="a Hugging Face model directory, a shape (with --seed) or a trainer checkpoint")
    m.add_argument("adapter", help="a PEFT LoRA directory (adapter_config.json + adapter_model.safetensors)")
    m.add_argument("out", help="the merged model's directory (created)")
    m.add_argument("--seed", type=int, default=0, help="the random weights of a shape BASE (default 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs ``python -m orion lora`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = parser().parse_args(argv)
    return report_errors(lambda: _merge(args))


def _merge(args: argparse.Namespace) -> int:
    from orion.models import family_of
    from orion.train.trainer import load_model

    base, params, _ = load_model(args.base, args.seed)
    adapter, modules = read_adapter(base, args.adapter)
    merged = merge(base, params, adapter, modules)
    out = Path(args.out)
    family_of(base.config).weights.save_hf(out, base.config, base.weights(merged))
    copied = [name for name in TOKENIZER_FILES if (Path(args.base) / name).is_file()]
    for name in copied:
        shutil.copy2(Path(args.base) / name, out / name)
    print(f"{out}: {args.base} with {args.adapter} merged ({len(adapter.modules)} modules, r={adapter.r}, "
          f"scale {adapter.scale:g}){'; tokenizer files copied' if copied else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
