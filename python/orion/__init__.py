"""Orion: compile transformer LLMs to MIL and run them on the Apple Neural Engine."""

from __future__ import annotations

from orion.errors import (
    CompileBudgetExhausted,
    CompileError,
    ConstraintError,
    EvaluateError,
    OrionError,
    ParseError,
)

__version__ = "0.1.0"
