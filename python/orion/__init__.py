"""Orion: compile transformer LLMs to MIL and run them on the Apple Neural Engine.

Low-level API: ``orion.compile(mil, weights)`` returns a :class:`Program`; call it with numpy
arrays or ``evaluate`` it on :class:`Surface` objects. Without an ANE, programs run on a
faithful software emulator (``orion.backend() == "emulator"``).
"""

from __future__ import annotations

from orion import blobfile, mil
from orion.compiler import CompiledGraph, compile_graph, lower
from orion.errors import (
    CompileBudgetExhausted,
    CompileError,
    ConstraintError,
    EvaluateError,
    OrionError,
    ParseError,
)
from orion.graph import Graph
from orion.limits import MIN_SURFACE_BYTES
from orion.runtime import profile as _profile  # noqa: F401  (ORION_PROFILE=1 prints its table at exit)
from orion.runtime.backend import backend, backend_info, compile_budget, compile_count
from orion.runtime.program import Program, TensorSpec, compile
from orion.runtime.surface import Surface

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``orion.models`` is imported on first use (it brings the tokenizer and safetensors libraries)."""
    if name == "models":
        import importlib

        return importlib.import_module("orion.models")
    raise AttributeError(f"module 'orion' has no attribute {name!r}")


__all__ = [
    "CompileBudgetExhausted",
    "CompiledGraph",
    "CompileError",
    "ConstraintError",
    "EvaluateError",
    "Graph",
    "MIN_SURFACE_BYTES",
    "OrionError",
    "ParseError",
    "Program",
    "Surface",
    "TensorSpec",
    "backend",
    "backend_info",
    "blobfile",
    "compile",
    "compile_budget",
    "compile_count",
    "compile_graph",
    "lower",
    "mil",
    "models",
]
