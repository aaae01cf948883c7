"""Errors of the training infrastructure; each says what is wrong, where, and how to fix it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from orion.errors import OrionError


class TrainError(OrionError):
    """Bad training input: an optimizer tensor's shape, dtype or layout, a hyperparameter, a state dict."""


class DataError(TrainError):
    """A token file or text corpus cannot be used (missing, empty, too short, wrong size, bad token ids)."""


class CheckpointError(TrainError):
    """A checkpoint is damaged, missing a file, or was written for another configuration.

    ``path`` is the checkpoint's manifest; ``previous`` is the newest older checkpoint that verifies
    (``None`` if there is none).
    """

    def __init__(self, message: str, path: Path | None = None, previous: Path | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.previous = previous


MAX_COUNT = 2**53  # steps and counters stay below this (exact as floats, far inside int64)


def is_count(value: Any) -> bool:
    """An int in [0, MAX_COUNT) (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT


def is_rate(value: Any) -> bool:
    """A finite number >= 0 (not a bool; an int as big as a float holds)."""
    return (isinstance(value, float) and math.isfinite(value) and value >= 0) or is_count(value)


def check_numbers(obj: Any) -> None:
    """Raises TrainError unless every field of dataclass ``obj`` typed ``int`` holds a count and every
    ``float`` a finite number >= 0 (a state read back from a checkpoint's JSON may hold anything)."""
    for field in dataclasses.fields(obj):
        value, integer = getattr(obj, field.name), field.type == "int"
        if not (is_count(value) if integer else is_rate(value)):
            raise TrainError(f"{type(obj).__name__}: {field.name}={value!r:.80} must be a finite "
                             f"{'integer' if integer else 'number'} >= 0")
