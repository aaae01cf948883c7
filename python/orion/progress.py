"""What Orion tells a person while it works: one updating progress line on stderr, and warnings
attributed to the caller's code rather than to Orion's internals."""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from typing import TextIO

_PACKAGE = str(Path(__file__).parent) + os.sep


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the code that called into Orion: the frame just outside the
    outermost ``orion`` frame (a callback from Orion back into Orion does not count as the caller)."""
    frame, level, outermost = sys._getframe(1), 2, 1  # stacklevel 2 is the caller of warn_user
    while frame is not None:
        if frame.f_code.co_filename.startswith(_PACKAGE):
            outermost = level
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=outermost + 1)


class ProgressLine:
    """``label done/total: detail`` rewritten in place on a terminal; elsewhere (a log, a pipe) only
    the final summary line is written, so captured stderr holds no half-updated lines. Disabled, it
    writes nothing."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self._stream = stream
        self.label, self.total, self.done, self._start = "", 0, 0, 0.0
        self._shown = False

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stderr

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self._start = label, total, 0, time.perf_counter()

    def step(self, detail: str) -> None:
        self.done += 1
        self.total = max(self.total, self.done)
        if self.enabled and self._interactive():
            self.stream.write(f"\r\x1b[K{self.label} {self.done}/{self.total}: {detail}")
            self.stream.flush()
            self._shown = True

    def finish(self, summary: str) -> None:
        """Replace the line with ``summary`` (``{seconds}`` is filled in) and end it."""
        if not self.enabled:
            return
        text = summary.format(seconds=f"{time.perf_counter() - self._start:.1f} s")
        self.stream.write(("\r\x1b[K" if self._shown else "") + text + "\n")
        self.stream.flush()
        self._shown = False

    def _interactive(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())
