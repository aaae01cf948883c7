"""``python -m orion lora merge BASE ADAPTER OUT``: fold a PEFT LoRA adapter into its base model.

BASE is what ``python -m orion train --model`` takes (a Hugging Face directory of any family Orion runs, a shape name with
``--seed``, or a full trainer checkpoint); OUT becomes a Hugging Face directory (``config.json`` +
``model.safetensors``, via the models' ``save_hf``) with every adapted weight ``W + scale * B A``
(``scale = alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA, computed in float32) and every other tensor the
base's. A base directory's form is kept: the weights in its dtype (bf16, fp16 or fp32, as its safetensors
store them), its ``config.json`` copied byte for byte (merging changes no setting), and its tokenizer files
and chat template copied along. A shape or checkpoint base is written in float32.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
from pathlib import Path

from orion.cli import report_errors
from orion.lora.adapter import AdapterError
from orion.lora.train import merge, read_adapter

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json")
DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}  # safetensors code -> save_hf's dtype


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
    source, out = Path(args.base), Path(args.out)
    is_directory = (source / "config.json").is_file()
    dtype = _stored_dtype(source) if is_directory else "float32"
    family_of(base.config).weights.save_hf(out, base.config, base.weights(merged), dtype=dtype)
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    for name in copied + (["config.json"] if is_directory else []):
        shutil.copy2(source / name, out / name)
    print(f"{out}: {args.base} with {args.adapter} merged ({len(adapter.modules)} modules, r={adapter.r}, "
          f"scale {adapter.scale:g}), {dtype}{'; config.json, tokenizer and template files copied' if copied else ''}")
    return 0


def _stored_dtype(directory: Path) -> str:
    """The dtype a Hugging Face directory's safetensors store its floating-point tensors in (the first file's)."""
    from orion.models.weights_io import INDEX_FILE, WEIGHTS_FILE

    index = directory / INDEX_FILE
    first = directory / WEIGHTS_FILE if not index.is_file() else \
        directory / sorted(set(json.loads(index.read_text())["weight_map"].values()))[0]
    with first.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    codes = {t["dtype"] for name, t in header.items() if name != "__metadata__"} & set(DTYPES)
    if len(codes) != 1:
        raise AdapterError(f"{first}: tensors stored as {sorted(codes) or 'no float type'}; the merge writes one of "
                           f"{', '.join(DTYPES)}. Fix: pass a base whose weights share one float dtype")
    return DTYPES[codes.pop()]


if __name__ == "__main__":
    sys.exit(main())
