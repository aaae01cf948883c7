"""How long GPT-2's deterministic random initialization takes (``random_weights``), per shape.

    python benchmarks/bench_random_init.py [--config 124m] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

from orion.models import GPT2Config
from orion.models.gpt2.weights import random_weights

CONFIGS = {"124m": GPT2Config(), "tiny": GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=256)}


def run(config_name: str = "124m", repeats: int = 3) -> dict:
    """Seconds of each ``random_weights`` call and the parameters it made."""
    config = CONFIGS[config_name]
    seconds = []
    for seed in range(repeats):
        start = time.perf_counter()
        weights = random_weights(config, seed)
        seconds.append(time.perf_counter() - start)
    params = sum(a.size for _, a in weights.arrays())
    return {"config": config_name, "parameters": params, "seconds": seconds, "best_s": min(seconds)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="124m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = run(args.config, max(1, args.repeats))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"random_weights({args.config}): {result['parameters'] / 1e6:.1f}M parameters, best "
              f"{result['best_s']:.2f} s of {len(result['seconds'])}")


if __name__ == "__main__":
    main()
