"""Children that Ctrl-C must reach. A test run started as a background job of a shell without job control
(``cmd &`` in a script, ``nohup``) inherits SIGINT ignored, and its children with it: Python then leaves it
ignored and never raises KeyboardInterrupt. The tests of Ctrl-C restore the default in the child first."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """A ``preexec_fn``: SIGINT back to its default disposition, so the child's Python installs its handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
