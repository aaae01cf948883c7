"""A text stream that says it is a terminal, for the tests of what Orion draws on one (``ProgressLine`` redraws its
line in place there)."""

from __future__ import annotations

import io


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True
