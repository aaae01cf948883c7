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


def check_numbers(obj: Any) -> None:
    """Raises TrainError unless every field of dataclass ``obj`` typed ``int`` holds an int and every
    ``float`` a finite number, each >= 0 (a state read back from a checkpoint's JSON may hold anything)."""
    for field in dataclasses.fields(obj):
        value, integer = getattr(obj, field.name), field.type == "int"
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value < 0:
            raise TrainError(f"{type(obj).__name__}: {field.name}={value!r} must be a finite "
                             f"{'integer' if integer else 'number'} >= 0")
