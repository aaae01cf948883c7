"""``python -m orion.bench decode [options]``: Orion's benchmarks (``decode``: any registered model)."""

from __future__ import annotations

import sys

BENCHMARKS = ("decode",)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m orion.bench {{{','.join(BENCHMARKS)}}} [options]  (--help after the name)",
              file=sys.stderr)
        return 2
    from orion.bench import decode

    return decode.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
