"""Reading the JSON files of a Hugging Face model directory, with Orion errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orion.errors import OrionError

CONFIG_FILE = "config.json"


class ModelFileError(OrionError, ValueError):
    """A model directory's file is missing, unreadable or not what it should be."""


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`ModelFileError` naming the file when it cannot be read."""
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not JSON, or a number of over 4,300 digits
        raise ModelFileError(f"{path}: not a readable JSON file ({exc})") from exc
    except RecursionError:
        raise ModelFileError(f"{path}: nested too deeply to parse; a model's JSON files are flat objects, "
                             f"replace this one with the model's original") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_optional(directory: Path, name: str) -> dict[str, Any]:
    """``directory/name`` as a JSON object, or ``{}`` when the file does not exist."""
    path = directory / name
    return read_json_object(path) if path.exists() else {}
