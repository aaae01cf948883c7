"""MIL programs in the dialect the ANE compiler accepts (docs/hardware.md §4).

``Program`` is the in-memory model with builder methods, ``emit`` writes its canonical text and
``parse`` reads MIL text back (raising ``orion.ParseError`` with line and column).
"""

from __future__ import annotations

from orion._core.mil import Argument, Operation, Program, Type, Value, emit, parse

__all__ = ["Argument", "Operation", "Program", "Type", "Value", "emit", "parse"]
