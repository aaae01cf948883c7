"""MIL programs in the dialect the ANE compiler accepts (docs/hardware.md §4).

``MilProgram`` is the in-memory model with builder methods, ``emit`` writes its canonical text and
``parse`` reads MIL text back (raising ``orion.ParseError`` with line and column).
"""

from __future__ import annotations

from orion._core.mil import Argument, MilProgram, Operation, Type, Value, emit, parse

__all__ = ["Argument", "MilProgram", "Operation", "Type", "Value", "emit", "parse"]
