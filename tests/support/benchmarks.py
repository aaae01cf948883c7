"""A file of ``benchmarks/`` as a module, for the tests of a benchmark's own logic (no model is run)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark_module(filename: str) -> Iterator[ModuleType]:
    """Yields ``benchmarks/filename`` loaded as a module, registered in ``sys.modules`` while in use (dataclasses look
    their module up there); a pytest fixture's body: ``yield from benchmark_module("bench_serve.py")``."""
    spec = importlib.util.spec_from_file_location(f"{Path(filename).stem}_under_test", BENCHMARKS / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
