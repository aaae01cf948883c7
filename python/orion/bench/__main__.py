"""``python -m orion.bench BENCHMARK [options]``: Orion's benchmarks (``decode``: any registered model)."""

from __future__ import annotations

import argparse
import sys

from orion.cli import HelpFormatter


def main(argv: list[str] | None = None) -> int:
    from orion.bench import decode

    parser = argparse.ArgumentParser(prog="python -m orion.bench", formatter_class=HelpFormatter,
                                     description="Orion's benchmarks. Each has its own --help.")
    benchmarks = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    bench = benchmarks.add_parser("decode", formatter_class=HelpFormatter, description=decode.__doc__,
                                  help="prefill and KV-cache decode of a model: compile, tok/s, dispatches, bytes")
    decode.add_arguments(bench)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    return decode.main(argv[1:]) if args.benchmark == "decode" else 2


if __name__ == "__main__":
    sys.exit(main())
