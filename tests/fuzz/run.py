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

# resume steers by the coverage of Orion's training code too (the server target's server runs in a
# process of its own); the others by the core's, leaving Orion's Python uninstrumented (faster).
RESUME = len(sys.argv) > 1 and sys.argv[1] == "resume"
with atheris.instrument_imports(include=["targets", "target_server", "target_resume", "json_values",
                                         *(["orion.train"] if RESUME else [])]):
    import targets

    if RESUME:
        import orion.train.trainer  # noqa: F401


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
