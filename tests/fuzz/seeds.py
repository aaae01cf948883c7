"""Write the seed corpus: ``python tests/fuzz/seeds.py [OUT_DIR]`` (default ``tests/fuzz/corpus``).

Seeds are hand-written programs (the conv and weighted programs of the tests) and programs the
compiler emits for small graphs (an MLP, attention, a tiny GPT-2's decode layer). The ``mil``
target's first byte picks the profile, so each program is written once per profile.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import targets  # noqa: E402

import orion  # noqa: E402
from orion import blobfile  # noqa: E402
from support.weighted import TEXT as WEIGHTED  # noqa: E402


def emitted_programs() -> dict[str, str]:
    rng = np.random.default_rng(0)
    d, s = 16, 32
    g = orion.Graph("mlp")
    x = g.input("x", [1, d, 1, s])
    g.output(g.linear(g.gelu(g.linear(x, rng.standard_normal((2 * d, d)) * 0.1)), rng.standard_normal((d, 2 * d)) * 0.1), "y")
    a = orion.Graph("attn")
    x = a.input("x", [1, d, 1, s])
    h = a.layer_norm(x, np.ones(d), np.zeros(d))
    a.output(a.attention(a.linear(h, np.eye(d)), a.linear(h, np.eye(d)), a.linear(h, np.eye(d)), heads=2), "y")
    return {name: orion.lower(graph)[0] for name, graph in (("mlp", g), ("attn", a))}


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "corpus"
    programs = {"conv": targets.CONV_MIL, "weighted": WEIGHTED, **emitted_programs()}
    (out / "mil").mkdir(parents=True, exist_ok=True)
    for name, text in programs.items():
        for profile, first in (("hardware", b"\0"), ("permissive", b"\1")):
            (out / "mil" / f"{name}-{profile}").write_bytes(first + text.encode())
    (out / "blobfile").mkdir(exist_ok=True)
    for shape in ((4, 4, 1, 1), (2, 3), (0,)):
        (out / "blobfile" / f"fp16-{'x'.join(map(str, shape))}").write_bytes(blobfile.write(np.ones(shape, np.float16)))
    (out / "blobfile" / "many").write_bytes(blobfile.write_many([np.ones(3, np.float16), np.zeros(5, np.float16)])[0])
    print(f"wrote {sum(1 for _ in out.rglob('*') if _.is_file())} seeds under {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
