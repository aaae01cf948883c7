"""The emulator's profiler: per program and per op kind, calls, time, bytes moved and FLOPs.

``ORION_PROFILE=1`` turns it on for the process and prints :func:`table` at exit; :func:`enable`
does so from code. Bytes are each op's operands and result at their MIL dtypes (fp16: 2 bytes an
element), the traffic the ANE would see; FLOPs count 2 per multiply-add for conv, matmul and
attention and one per output element for arithmetic, none for data movement (reshape, transpose,
slice, concat, ...). The ``(io)`` row is the surface loads and stores of each evaluate. Off, an
evaluate pays one atomic load.
"""

from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass

from orion import _core

ENV = "ORION_PROFILE"


@dataclass(frozen=True)
class Row:
    """One op kind of one program, summed over every profiled evaluate."""

    program: str
    op: str
    calls: int
    seconds: float
    bytes: float
    flops: float

    @property
    def gflops(self) -> float:
        """Achieved GFLOP/s."""
        return self.flops / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def gbps(self) -> float:
        """Achieved GB/s of the bytes moved."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def enabled() -> bool:
    """Whether evaluates are being profiled."""
    return _core.profile.enabled()


def enable(on: bool = True) -> None:
    """Starts (or, with ``on=False``, stops) profiling evaluates; recorded rows are kept."""
    _core.profile.set_enabled(on)


def reset() -> None:
    """Forgets every recorded row."""
    _core.profile.reset()


def snapshot() -> list[Row]:
    """Every recorded row, slowest first."""
    rows = [Row(**r) for r in _core.profile.snapshot()]
    return sorted(rows, key=lambda r: r.seconds, reverse=True)


def table(rows: list[Row] | None = None, top: int = 12) -> str:
    """The profile as text: one block per program (slowest first, its ``top`` op kinds), then the
    op kinds summed over all programs."""
    rows = snapshot() if rows is None else rows
    if not rows:
        return "orion profile: no evaluates recorded"
    total = sum(r.seconds for r in rows)
    lines = [f"orion profile: {total * 1e3:.1f} ms in {len({r.program for r in rows})} programs"]
    header = f"  {'op':<32}{'calls':>8}{'ms':>10}{'%':>6}{'MB':>10}{'GFLOP':>9}{'GFLOP/s':>9}{'GB/s':>7}"

    def block(title: str, block_rows: list[Row]) -> None:
        block_s = sum(r.seconds for r in block_rows)
        lines.extend(["", f"{title}: {block_s * 1e3:.1f} ms", header])
        for r in sorted(block_rows, key=lambda r: r.seconds, reverse=True)[:top]:
            share = 100 * r.seconds / total if total > 0 else 0.0
            lines.append(f"  {r.op:<32}{r.calls:>8}{r.seconds * 1e3:>10.1f}{share:>6.1f}{r.bytes / 1e6:>10.1f}"
                         f"{r.flops / 1e9:>9.2f}{r.gflops:>9.1f}{r.gbps:>7.1f}")

    programs: dict[str, list[Row]] = {}
    for r in rows:
        programs.setdefault(r.program, []).append(r)
    for name, block_rows in sorted(programs.items(), key=lambda kv: -sum(r.seconds for r in kv[1])):
        block(f"program {name}", block_rows)
    kinds: dict[str, Row] = {}
    for r in rows:
        k = kinds.get(r.op)
        kinds[r.op] = r if k is None else Row("all", r.op, k.calls + r.calls, k.seconds + r.seconds,
                                                k.bytes + r.bytes, k.flops + r.flops)
    block("all programs, by op kind", list(kinds.values()))
    return "\n".join(lines)


_report_registered = False


def enable_with_report() -> None:
    """Starts profiling and prints :func:`table` to stderr at exit (what ``ORION_PROFILE=1`` does)."""
    global _report_registered
    enable()
    if not _report_registered:
        _report_registered = True
        atexit.register(lambda: print(table(), file=sys.stderr))


if os.environ.get(ENV, "") not in ("", "0"):
    enable_with_report()
