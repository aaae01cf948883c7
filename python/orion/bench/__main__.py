"""``python -m orion.bench BENCHMARK [options]``: Orion's benchmarks (``decode``: any registered model;
``train``: a training step against PyTorch, with the M4 cost model)."""

from __future__ import annotations

import argparse
import sys

from orion.cli import HelpFormatter


def main(argv: list[str] | None = None) -> int:
    from orion.bench import decode, train

    parser = argparse.ArgumentParser(prog="python -m orion.bench", formatter_class=HelpFormatter,
                                     description="Orion's benchmarks. Each has its own --help.")
    benchmarks = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    bench = benchmarks.add_parser("decode", formatter_class=HelpFormatter, description=decode.__doc__,
                                  help="prefill and KV-cache decode of a model: compile, tok/s, dispatches, bytes")
    decode.add_arguments(bench)
    bench = benchmarks.add_parser("train", formatter_class=HelpFormatter, description=train.__doc__,
                                  help="training steps side by side with PyTorch: ms/step, FLOP split, M4 model")
    train.add_arguments(bench)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    return {"decode": decode.main, "train": train.main}[args.benchmark](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
