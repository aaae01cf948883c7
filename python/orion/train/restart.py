"""The exec() restart that resets the per-process compile budget (ANE-11), and when to take it.

A run checkpoints, then calls ``exec_restart()``: the same interpreter re-runs the same command line
(``sys.orig_argv``, so ``python -m orion train ...`` stays a module run) with ``--resume`` added once,
in the same process id, after the logs are flushed and every file descriptor but stdin/stdout/stderr
is marked close-on-exec. ``needs_restart(n)`` says whether compiling ``n`` more programs would cross
the conservative threshold: 100 of the default 119, the margin the public ANE trainers use.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import IO, NoReturn

from orion.runtime.backend import compile_budget, compile_count
from orion.train.errors import TrainError

THRESHOLD_FRACTION = 100 / 119
RESUME_FLAG = "--resume"


def compile_threshold(budget: int | None = None) -> int:
    """Compiles a process may do before it should restart: ``floor(budget * 100/119)`` (100 of 119)."""
    return int((compile_budget() if budget is None else budget) * THRESHOLD_FRACTION + 1e-9)


def needs_restart(next_compiles: int) -> bool:
    """True if compiling ``next_compiles`` more programs would take this process past ``compile_threshold()``."""
    if next_compiles < 0:
        raise TrainError(f"needs_restart: next_compiles={next_compiles} must be >= 0")
    return compile_count() + next_compiles > compile_threshold()


def restart_argv(resume_flag: str = RESUME_FLAG) -> list[str]:
    """The command line of the restarted process: this one's, with ``resume_flag`` appended unless present."""
    argv = list(sys.orig_argv) if sys.orig_argv else [sys.executable, *sys.argv]
    args = argv[1:]
    return [sys.executable, *args, *([] if resume_flag in args else [resume_flag])]


def exec_restart(logs: Sequence[IO] = (), resume_flag: str = RESUME_FLAG) -> NoReturn:
    """Flushes ``logs``, the logging handlers, stdout and stderr, marks fds >= 3 close-on-exec and execs
    ``restart_argv()``. Returns only by raising (TrainError) if the exec fails."""
    for log in logs:
        log.flush()
        try:
            os.fsync(log.fileno())
        except OSError:  # a pipe or a terminal: flushed is all there is
            pass
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    for fd in _open_fds():
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:  # closed meanwhile (the directory listing's own fd)
                continue
    argv = restart_argv(resume_flag)
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        raise TrainError(f"exec_restart: os.execv({argv[0]!r}, ...) failed ({exc}); restart the command with "
                         f"{resume_flag} by hand") from exc


def _open_fds() -> list[int]:
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            return [int(name) for name in os.listdir(listing)]
        except OSError:
            continue
    return list(range(3, min(os.sysconf("SC_OPEN_MAX"), 65536)))  # no fd listing: try every plausible fd
