"""Errors of the training infrastructure; each says what is wrong, where, and how to fix it."""

from __future__ import annotations

from pathlib import Path

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
