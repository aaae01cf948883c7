"""One Orion benchmark on two commits side by side, in one run.

Each commit is built once in its own worktree, venv and build directory under --work (reused by later
runs), unless --python-a/--python-b name an interpreter that already has it installed. Then passes of
``python -m orion.bench BENCH_ARGS --json`` alternate A, B, A, B, ... in fresh subprocesses, so that
load from other work on the machine falls on both sides alike. The report gives each metric's median
per side, the ratio of the medians B/A, the median of the per-pass ratios (B over the A pass just
before it: robust when the load changes during the run), and the 1-minute load average around the
passes.

    python benchmarks/compare_commits.py c8c392c HEAD --python-b .venv/bin/python --passes 5 -- \\
        decode --prompt-tokens 16 --new-tokens 64

BENCH_ARGS must mean the same to both commits' ``orion.bench`` CLI; each pass must print one JSON
object as its last line of output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_METRICS = ("decode_tok_s", "ms_per_token_p50", "prefill_ms")


class CompareError(Exception):
    """A build or a pass failed; the message says which and shows its output."""


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise CompareError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-4000:]}")
    return result


def commit_of(rev: str) -> str:
    """The full hash of ``rev`` in this repository."""
    return _run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"]).stdout.strip()


def build(commit: str, work: Path) -> Path:
    """The interpreter of a venv with ``commit`` installed (editable, Release), built on first use."""
    tree, venv, build_dir = work / f"tree-{commit[:12]}", work / f"venv-{commit[:12]}", work / f"build-{commit[:12]}"
    python, done = venv / "bin" / "python", venv / ".orion-built"
    if done.exists():
        return python
    work.mkdir(parents=True, exist_ok=True)
    if not tree.exists():
        _run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit])
    if not python.exists():
        _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    print(f"building {commit[:12]} in {tree} ...", file=sys.stderr, flush=True)
    _run([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", "-C", f"build-dir={build_dir}", "-e",
          str(tree)], env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")})
    done.write_text(commit + "\n")
    return python


def one_pass(python: Path, bench_args: list[str]) -> dict[str, Any]:
    """One benchmark run in a fresh process (outside any worktree, so only the install is imported)."""
    out = _run([str(python), "-m", "orion.bench", *bench_args, "--json"], cwd="/tmp").stdout
    return json.loads(out.strip().splitlines()[-1])


def compare(pythons: dict[str, Path], bench_args: list[str], passes: int, metrics: list[str]) -> dict[str, Any]:
    """Interleaved passes; every figure per side and the medians."""
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in pythons}
    loads = [os.getloadavg()[0]]
    for i in range(passes):
        for side, python in pythons.items():
            runs[side].append(one_pass(python, bench_args))
            loads.append(os.getloadavg()[0])
            value = ", ".join(f"{m} {runs[side][-1].get(m, float('nan')):.2f}" for m in metrics)
            print(f"pass {i + 1}/{passes} {side}: {value} (load {loads[-1]:.2f})", file=sys.stderr, flush=True)
    medians = {side: {m: statistics.median(r[m] for r in rs) for m in metrics} for side, rs in runs.items()}
    pair_ratios = {m: statistics.median(b[m] / a[m] for a, b in zip(runs["A"], runs["B"])) for m in metrics}
    return {"passes": passes, "runs": {s: [{m: r[m] for m in metrics} for r in rs] for s, rs in runs.items()},
            "medians": medians, "ratio_b_over_a": {m: medians["B"][m] / medians["A"][m] for m in metrics},
            "pair_ratio_median": pair_ratios,
            "load_1min": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)}}


def report(result: dict[str, Any], labels: dict[str, str]) -> str:
    lines = [f"{'metric':<20} {'A median':>12} {'B median':>12} {'B/A':>7} {'pairs B/A':>10}   "
             f"(A = {labels['A']}, B = {labels['B']})"]
    for m, ratio in result["ratio_b_over_a"].items():
        lines.append(f"{m:<20} {result['medians']['A'][m]:>12.3f} {result['medians']['B'][m]:>12.3f} {ratio:>7.3f} "
                     f"{result['pair_ratio_median'][m]:>10.3f}")
    load = result["load_1min"]
    lines.append(f"{result['passes']} interleaved passes per side; 1-min load average min {load['min']:.2f}, "
                 f"median {load['median']:.2f}, max {load['max']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, bench_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev_a", help="the reference commit (A)")
    parser.add_argument("rev_b", help="the commit compared with it (B)")
    parser.add_argument("--python-a", type=Path, help="an interpreter that already has A installed (no build)")
    parser.add_argument("--python-b", type=Path, help="an interpreter that already has B installed (no build)")
    parser.add_argument("--passes", type=int, default=5, help="passes per side (default 5)")
    parser.add_argument("--metric", action="append", help=f"a JSON field to compare (default: {', '.join(DEFAULT_METRICS)})")
    parser.add_argument("--work", type=Path, default=Path("/tmp/orion-compare"), help="where worktrees, venvs and builds go")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(ours)
    if not bench_args:
        parser.error("give the benchmark's arguments after --, e.g. -- decode --new-tokens 64")
    if args.passes < 1:
        parser.error("--passes must be at least 1")
    try:
        labels = {"A": f"{args.rev_a} ({commit_of(args.rev_a)[:7]})", "B": f"{args.rev_b} ({commit_of(args.rev_b)[:7]})"}
        pythons = {"A": args.python_a or build(commit_of(args.rev_a), args.work),
                   "B": args.python_b or build(commit_of(args.rev_b), args.work)}
        result = compare(pythons, bench_args, args.passes, args.metric or list(DEFAULT_METRICS))
    except CompareError as e:
        print(f"compare_commits: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"labels": labels, **result}) if args.json else report(result, labels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
