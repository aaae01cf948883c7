"""Shared pieces of Orion's command lines: argument types and how errors are reported."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from orion.errors import OrionError


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (anything else is a usage error)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is below {low}")
    return value


def report_errors(command: Callable[[], int]) -> int:
    """Runs ``command``; an Orion error becomes one ``error:`` line on stderr and exit status 1."""
    try:
        return command()
    except OrionError as err:
        sys.stdout.flush()
        print(f"error: {err}", file=sys.stderr)
        return 1
