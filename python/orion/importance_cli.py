"""``python -m orion imatrix --model MODEL --text FILE...``: an importance matrix for the lut4/lut6 quantizers,
as llama.cpp's ``llama-imatrix -m MODEL -f FILE`` makes one for ``llama-quantize --imatrix``.

The text files are read as UTF-8, joined by blank lines and tokenized by the model's tokenizer; the tokens run
through the model in windows of ``--window`` (:func:`orion.importance.collect`). Use text like what the model
will see, and not the text you measure it on. Then ``--quant lut6 --imatrix OUT`` on ``generate``, ``chat``,
``serve`` and ``orion.bench`` (or ``load(..., quant="lut6", imatrix=OUT)``) uses it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from orion import importance
from orion.cli import HelpFormatter, positive_int, report_errors, write_out
from orion.importance import ImportanceError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orion imatrix", formatter_class=HelpFormatter, description=(
        "Collect an importance matrix of MODEL's linear weights over calibration text, for --quant lut4/lut6\n"
        "(--imatrix OUT on generate, chat, serve and orion.bench), as llama.cpp's llama-imatrix does for\n"
        "llama-quantize. Use text like what the model will see, not the text you measure it on."))
    p.add_argument("--model", required=True, help="a Hugging Face model directory or a checkpoint file (.gguf, "
                                                   "llama2.c .bin) with its tokenizer")
    p.add_argument("--text", required=True, nargs="+", metavar="FILE", help="calibration text files (UTF-8)")
    p.add_argument("--out", default=None, help="the .npz written (default: <model name>.imatrix.npz here)")
    p.add_argument("--tokens", type=positive_int, default=None, help="use the first N tokens (default: all)")
    p.add_argument("--window", type=positive_int, default=importance.DEFAULT_WINDOW,
                   help="tokens per forward pass, each from position 0 (at most the model's context)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs ``python -m orion imatrix`` with ``argv``; returns the exit status."""
    args = parser().parse_args(argv)
    return report_errors(lambda: _collect(args))


def _collect(args: argparse.Namespace) -> int:
    from orion import models

    text = "\n\n".join(_read(Path(f)) for f in args.text)
    model = models.load(args.model, progress=not args.quiet)
    ids = model.tokenizer.encode(text)[:args.tokens]
    what = f"{len(ids)} tokens of {', '.join(Path(f).name for f in args.text)}"
    found = importance.collect(model, ids, what, window=args.window, progress=not args.quiet)
    out = found.save(args.out or f"{Path(args.model).stem if Path(args.model).is_file() else Path(args.model).name}"
                                 ".imatrix.npz")
    write_out(f"wrote {out}: the importance of {len(found.layers)} layers' linear weights over {what}\n")
    return 0


def _read(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ImportanceError(f"calibration text {path}: cannot be read as UTF-8 ({exc}). Fix: pass text "
                              "files") from None
    if not text.strip():
        raise ImportanceError(f"calibration text {path}: empty. Fix: pass a file with text")
    return text
