"""Shared pieces of Orion's command lines: argument types and how errors are reported."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
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


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """An option's help ends with its default, once: not when the help already says what the default does
    (``None: ...``, ``default ...``), nor for a flag or an option without a default. Descriptions keep
    their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "None:" in text or "default" in text.lower():
            return text
        return super()._get_help_string(action)


INTERRUPTED = 130  # the shell's status for a process ended by SIGINT
BROKEN_PIPE = 141  # the shell's status for a process ended by SIGPIPE (its reader closed the pipe)


def report_errors(command: Callable[[], int]) -> int:
    """Runs ``command``: an Orion error becomes one ``error:`` line on stderr and exit status 1,
    Ctrl-C one ``interrupted`` line and status 130, a closed stdout (``| head``) status 141 and no
    output (never a traceback). Warnings print as one
    ``warning:`` line each."""
    warnings.formatwarning = lambda message, category, *rest, **kw: f"warning: {message}\n"
    try:
        return command()
    except OrionError as err:
        _end_stdout_line()
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        _end_stdout_line()
        print("interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as SIGPIPE stops other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return BROKEN_PIPE


_stdout_open_line = False


def write_out(text: str) -> None:
    """Text to stdout, remembering whether the line is still open (so an error ends it first)."""
    global _stdout_open_line
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()
        _stdout_open_line = not text.endswith("\n")


def _end_stdout_line() -> None:
    if _stdout_open_line:
        write_out("\n")
    sys.stdout.flush()
