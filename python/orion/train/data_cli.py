"""``python -m orion data prepare TEXT_FILES... --out DIR [--vocab-size N | --tokenizer PATH]``.

Without TEXT_FILES the text is the built-in standard-library corpus (``--max-bytes`` cuts it).
"""

from __future__ import annotations

import argparse
import sys

from orion.errors import OrionError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orion data", description="Token data for training.")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="tokenize text files into train.bin/val.bin (uint16, or uint32 "
                                  "above 65,536 ids), tokenizer.json and meta.json (which records the tokenizer)")
    prepare.add_argument("text_files", nargs="*", metavar="TEXT_FILES",
                         help="UTF-8 text files, one document each (default: the Python standard library's sources)")
    prepare.add_argument("--out", required=True, help="output directory")
    which = prepare.add_mutually_exclusive_group()
    which.add_argument("--vocab-size", type=int, default=8192, help="train a byte-level BPE of this many tokens "
                       "(default 8192)")
    which.add_argument("--tokenizer", help="tokenize with this tokenizer.json instead (e.g. the model's)")
    prepare.add_argument("--val-fraction", type=float, default=0.1, help="held-out share of the tokens (default 0.1)")
    prepare.add_argument("--max-bytes", type=int, default=None, help="cut the built-in corpus to this many bytes")
    args = parser.parse_args(argv)

    from orion.train.data import prepare as prepare_data

    try:
        meta = prepare_data(args.text_files, args.out, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                            val_fraction=args.val_fraction, max_bytes=args.max_bytes)
    except OrionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.out}: {meta['tokens']['train']:,} train + {meta['tokens']['val']:,} val tokens ({meta['dtype']}), "
          f"vocabulary {meta['vocab_size']:,} ({meta['tokenizer_origin']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
