"""Times one-conv programs with fp16, int8, lut4, int4 and lut6 weights side by side, interleaved.

Each mode is a compiled program computing one linear (a 1x1 conv) of [1, cin, 1, 32] activations,
evaluated on its surfaces with `--lanes` live lanes (1: a decode step). Every pass times each mode once
(`--calls` evaluates, the modes in a rotating order), so load from other work falls on all alike; the
report gives each mode's median ms over the passes and its ratio to int8's (the median of the per-pass
ratios), with the 1-minute load average before and after. `--copies N` builds N programs per mode, each
with its own weight, evaluated in turn (a call is one of each): with enough copies the weights no longer
fit the caches and are streamed from DRAM, as a model's decode streams them.

With `--baseline-pythonpath DIR` the passes alternate between this checkout and DIR (another build of
`orion`, e.g. a worktree of the commit before), each pass in a fresh subprocess: an A/B of old and new
kernels in one run, reported as new / old per mode.

    python benchmarks/bench_low_bit_conv.py [--shape 3072x768] [--lanes 1] [--passes 7] [--calls 50] [--copies 16]
    python benchmarks/bench_low_bit_conv.py --baseline-pythonpath /path/to/old/python [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MODES = ("fp16", "int8", "lut4", "int4", "lut6")
SEQ = 32


def build_programs(cout: int, cin: int, modes: tuple[str, ...], copies: int) -> dict:
    """Per mode: `copies` (program, input surfaces, output surfaces, input MIL name) of one linear [cin] -> [cout],
    each with its own weight."""
    from orion import compiler, quant
    from orion.graph import Graph

    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((cout, cin)) / np.sqrt(cin) for _ in range(copies)]
    x = rng.standard_normal((1, cin, 1, SEQ)).astype(np.float16)
    built: dict[str, list] = {mode: [] for mode in modes}
    for mode, (copy, w) in ((m, cw) for m in modes for cw in enumerate(weights)):
        g = Graph(f"conv_{mode}_{copy}")
        xin = g.input("x", [1, cin, 1, SEQ])
        g.output(g.linear(xin, quant.weight_operand(g, w, mode, "lin"), name="lin"), "y")
        compiled = compiler.compile_lowered(compiler.lower_graph(g), profile="permissive")
        program = compiled.program
        inputs, outputs = program.allocate_surfaces()
        for name, packed in compiled.pack_inputs({"x": x}).items():
            inputs[name].write(packed)
        # the live-lanes hint names x: the I/O padding's cut of it when small, else its surface
        name = next((n for n, (_, _, shape) in program.input_parts.items() if shape == x.shape),
                    compiled.layout.inputs[0].mil_name)
        built[mode].append((program, inputs, outputs, name))
    return built


def one_pass(cout: int, cin: int, lanes: int, calls: int, modes: tuple[str, ...], rotate: int, built: dict) -> dict:
    """Seconds per evaluate of each mode, the modes timed in an order rotated by `rotate`."""
    order = modes[rotate % len(modes):] + modes[:rotate % len(modes)]
    times = {}
    for mode in order:
        for program, inputs, outputs, name in built[mode]:  # warm
            program.evaluate(inputs, outputs, live_lanes={name: lanes})
        start = time.perf_counter()
        for _ in range(calls):
            for program, inputs, outputs, name in built[mode]:
                program.evaluate(inputs, outputs, live_lanes={name: lanes})
        times[mode] = (time.perf_counter() - start) / calls
    return times


def summarize(passes: list[dict], modes: tuple[str, ...], reference: str) -> dict:
    """Median ms per mode and the median per-pass ratio to `reference`."""
    out = {}
    for mode in modes:
        out[mode] = {"median_ms": statistics.median(p[mode] for p in passes) * 1e3,
                     f"vs_{reference}": statistics.median(p[mode] / p[reference] for p in passes)}
    return out


def run_subprocess_pass(pythonpath: str, args: argparse.Namespace, rotate: int) -> dict:
    cmd = [sys.executable, __file__, "--shape", args.shape, "--lanes", str(args.lanes), "--calls", str(args.calls),
           "--copies", str(args.copies), "--modes", ",".join(args.modes), "--single-pass", str(rotate)]
    env = {**os.environ, "PYTHONPATH": pythonpath}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"pass failed under PYTHONPATH={pythonpath}:\n{result.stdout[-2000:]}{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="3072x768", help="COUTxCIN of the conv (GPT-2's MLP up: 3072x768)")
    parser.add_argument("--lanes", type=int, default=1, help="live lanes of the 32 (1: decode)")
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50, help="calls timed per mode and pass")
    parser.add_argument("--copies", type=int, default=1, help="programs (distinct weights) per mode, one call each")
    parser.add_argument("--modes", type=lambda s: tuple(s.split(",")), default=MODES)
    parser.add_argument("--baseline-pythonpath", help="A/B against the orion package under this directory")
    parser.add_argument("--single-pass", type=int, help=argparse.SUPPRESS)  # one pass, for the A/B driver
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cout, cin = (int(v) for v in args.shape.lower().split("x"))
    reference = "int8" if "int8" in args.modes else args.modes[0]

    if args.single_pass is not None:
        built = build_programs(cout, cin, args.modes, args.copies)
        print(json.dumps(one_pass(cout, cin, args.lanes, args.calls, args.modes, args.single_pass, built)))
        return

    load_before = os.getloadavg()[0]
    if args.baseline_pythonpath:
        here = str(Path(__file__).resolve().parents[1] / "python")
        sides: dict[str, list[dict]] = {"old": [], "new": []}
        for i in range(args.passes):
            for side, path in (("old", args.baseline_pythonpath), ("new", here))[:: 1 if i % 2 == 0 else -1]:
                sides[side].append(run_subprocess_pass(path, args, i))
        report = {side: summarize(passes, args.modes, reference) for side, passes in sides.items()}
        report["new_over_old"] = {m: statistics.median(n[m] / o[m] for n, o in zip(sides["new"], sides["old"]))
                                  for m in args.modes}
    else:
        built = build_programs(cout, cin, args.modes, args.copies)
        passes = [one_pass(cout, cin, args.lanes, args.calls, args.modes, i, built) for i in range(args.passes)]
        report = {"new": summarize(passes, args.modes, reference)}
    report["load_average"] = [load_before, os.getloadavg()[0]]
    report["config"] = {"shape": [cout, cin], "lanes": args.lanes, "passes": args.passes, "calls": args.calls,
                        "copies": args.copies}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"conv {cout}x{cin} x {args.copies} weight(s), {args.lanes} live lane(s) of {SEQ}, "
          f"{args.passes} passes x {args.calls} calls, "
          f"load average {load_before:.1f} -> {report['load_average'][1]:.1f}")
    sides_shown = [s for s in ("old", "new") if s in report]
    header = f"{'mode':>6} | " + " | ".join(f"{s + ' ms':>9} {s + '/' + reference:>12}" for s in sides_shown)
    if "new_over_old" in report:
        header += f" | {'new/old':>8}"
    print(header)
    print("-" * len(header))
    for mode in args.modes:
        row = f"{mode:>6} | " + " | ".join(
            f"{report[s][mode]['median_ms']:>9.3f} {report[s][mode]['vs_' + reference]:>12.2f}" for s in sides_shown)
        if "new_over_old" in report:
            row += f" | {report['new_over_old'][mode]:>8.2f}"
        print(row)


if __name__ == "__main__":
    main()
