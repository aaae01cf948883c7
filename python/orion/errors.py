"""Orion's exceptions. Every error says what went wrong, where (file, line, node) and how to fix it."""

from __future__ import annotations


class OrionError(Exception):
    """Base class of every error Orion raises on purpose."""


class CompileError(OrionError):
    """A program cannot be compiled: malformed MIL, a type error, a missing weight file."""


class ParseError(CompileError):
    """Malformed MIL text; ``line`` and ``column`` are 1-based."""

    def __init__(self, message: str, line: int = 0, column: int = 0) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


class EvaluateError(OrionError):
    """A program cannot be evaluated with the given inputs or surfaces."""


class ConstraintError(CompileError, EvaluateError):
    """A known ANE rule is broken, caught before compile or before evaluate.

    ``constraint`` is the stable id of the rule in ``orion.constraints`` (for example ``"ANE-01"``).
    """

    def __init__(self, message: str, constraint: str) -> None:
        super().__init__(message)
        self.constraint = constraint


class CompileBudgetExhausted(OrionError):
    """This process has used up its compile budget (about 119 on the ANE); restart the process."""
