"""Run one fuzz target under atheris (libFuzzer): ``python tests/fuzz/run.py TARGET [libFuzzer flags] [CORPUS...]``.

Examples (``tests/fuzz/README.md`` has more):
    python tests/fuzz/run.py mil -runs=100000 tests/fuzz/corpus/mil
    python tests/fuzz/run.py grammar -fork=2 -ignore_crashes=1 -runs=1000000 -artifact_prefix=/tmp/crashes/

Findings (signals, sanitizer reports, exceptions other than OrionError, timeouts) are written by
libFuzzer as ``crash-*``/``timeout-*`` files; each one found becomes a regression input in
``tests/fuzz/regressions/`` that ``test_fuzz.py`` replays.
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

with atheris.instrument_imports(include=["targets"]):
    import targets


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in targets.TARGETS:
        sys.exit(f"usage: run.py TARGET [libFuzzer flags] [CORPUS...]; targets: {', '.join(targets.TARGETS)}")
    target = targets.TARGETS[sys.argv[1]]
    os.environ.setdefault("ORION_COMPILE_BUDGET", "1000000000")  # fuzzing compiles far more than 119 programs
    os.environ.setdefault("ORION_CACHE_DIR", "off")
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
