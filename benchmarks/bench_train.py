"""Training-step benchmark: ``python -m orion.bench train`` (orion/bench/train.py), kept as a script.

    python benchmarks/bench_train.py                      # Stories110M shape, seq 256: about a minute
    python benchmarks/bench_train.py --model tiny-llama --steps 20
"""

from __future__ import annotations

import sys

from orion.bench.train import main

if __name__ == "__main__":
    sys.exit(main())
