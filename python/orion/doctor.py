"""``python -m orion doctor``: what this install can do here, and a tiny program run end to end."""

from __future__ import annotations

import json
import platform
import tempfile
import time
from typing import Any

import numpy as np

import orion
from orion import _core, models
from orion.errors import OrionError
from orion.program_cache import CacheDirError, cache_dir, max_size, usage

# x and y packed in one input surface and cut apart inside (the one-input form, ANE-37)
TINY = """program(1.3)
[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, {"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, {"coremltools-version", "9.0"}})]
{
    func main<ios18>(tensor<fp16, [1, 128, 1, 384]> xy) {
        tensor<int32, [4]> xb = const()[name=string("xb"), val=tensor<int32, [4]>([0, 0, 0, 0])];
        tensor<int32, [4]> yb = const()[name=string("yb"), val=tensor<int32, [4]>([0, 64, 0, 0])];
        tensor<int32, [4]> sz = const()[name=string("sz"), val=tensor<int32, [4]>([1, 64, 1, 384])];
        tensor<fp16, [1, 64, 1, 384]> x = slice_by_size(begin=xb, size=sz, x=xy)[name=string("x")];
        tensor<fp16, [1, 64, 1, 384]> y = slice_by_size(begin=yb, size=sz, x=xy)[name=string("y")];
        tensor<fp16, [1, 64, 1, 384]> s = add(x=x, y=y)[name=string("s")];
        tensor<fp16, [1, 64, 1, 384]> t = tanh(x=s)[name=string("t")];
    } -> (t);
}
"""


class ReportNotWritten(OrionError):
    """The probe report cannot be written where ``--out`` says."""


def _lowered_cache() -> dict[str, Any]:
    try:
        root = cache_dir()
    except CacheDirError as err:
        return {"path": f"unusable: {err}"}
    if root is None:
        return {"path": "off (ORION_CACHE_DIR=off)"}
    return {"path": str(root), **usage(root), "max_bytes": max_size()}


def _backend() -> tuple[dict[str, Any], str | None]:
    """The backend selection, or the error that stops it (a bad ORION_BACKEND, a framework that fails)."""
    try:
        return orion.backend_info(), None
    except OrionError as err:
        return {"name": None, "reason": None, "backends": [], "ane_client_built": _core.ane_client_built(),
                "framework_path": None}, str(err)


def report() -> dict[str, Any]:
    info, backend_error = _backend()
    frameworks = {name: {"available": ok, "detail": detail} for name, ok, detail in info["backends"]}
    kernels = _core.kernels
    out = {
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "orion": orion.__version__,
        "backend": info["name"],
        "why": info["reason"],
        "backend_error": backend_error,
        "ane_client_built": info["ane_client_built"],
        "ane_framework": frameworks.get("ane", {"available": False,
                                                "detail": "not built into this install (needs macOS)"}),
        "framework_path": info["framework_path"],
        "emulator": {"threads": kernels.num_threads(), "simd": kernels.simd_path()},
        "compile_budget": {"used": orion.compile_count(), "limit": _core.compile_limit(),
                           "budget": orion.compile_budget()},
        "cache": {"compiled_programs": "in-process, by content hash (orion.compiler); the OS caches ANE compiles",
                  "lowered_programs": _lowered_cache(),
                  "model_dirs": tempfile.gettempdir() + "/<hexStringIdentifier> while a program is loaded (ane)"},
        "models": {"model_types": models.model_types(), "random_shapes": models.shape_names()},
        "docs": "README.md (running on a Mac, the emulator), docs/hardware.md (the ANE's rules), docs/compiler.md",
    }
    if backend_error:
        out["end_to_end"] = {"ok": False, "error": f"not run: {backend_error}"}
        return out
    x = np.random.default_rng(0).standard_normal((1, 64, 1, 384)).astype(np.float16)
    y = np.random.default_rng(1).standard_normal((1, 64, 1, 384)).astype(np.float16)
    start = time.perf_counter()
    try:
        with orion.compile(TINY) as p:
            t = p(xy=np.concatenate([x, y], axis=1))["t"].astype(np.float32)
        err = float(np.max(np.abs(t - np.tanh(x.astype(np.float32) + y.astype(np.float32)))))
        out["end_to_end"] = {"ok": err < 2e-2, "max_error": err, "ms": round((time.perf_counter() - start) * 1e3, 2)}
    except orion.OrionError as e:
        out["end_to_end"] = {"ok": False, "error": str(e)}
    out["compile_budget"]["used"] = orion.compile_count()
    return out


def _cache_line(c: dict[str, Any]) -> str:
    if "bytes" not in c:
        return c["path"]
    return (f"{c['path']}: {c['entries']} programs, {c['bytes'] / 1e6:.1f} MB of a {c['max_bytes'] / 1e6:.0f} MB "
            f"cap (ORION_CACHE_DIR, ORION_CACHE_MAX_SIZE; python -m orion cache info|clear)")


def main(probe: bool = False, out: str | None = None, as_json: bool = False) -> int:
    r = report()
    if as_json:
        print(json.dumps(r, indent=2))
    else:
        print(f"platform:        {r['platform']} (Python {r['python']}, orion {r['orion']})")
        if r["backend_error"]:
            print(f"backend:         ERROR: {r['backend_error']}")
        else:
            print(f"backend:         {r['backend']}: {r['why']}")
        fw = r["ane_framework"]
        print(f"ANE framework:   {'found' if fw['available'] else 'not found'} ({fw['detail']})")
        print(f"emulator:        {r['emulator']['threads']} threads (ORION_NUM_THREADS), SIMD {r['emulator']['simd']} "
              f"(ORION_SIMD=portable forces the portable kernels)")
        b = r["compile_budget"]
        print(f"compile budget:  {b['used']} of {b['limit']} used (the ANE's ~{b['budget']}, less a margin)"
              if b["limit"] < b["budget"] else f"compile budget:  {b['used']} of {b['limit']} used")
        print(f"program cache:   {_cache_line(r['cache']['lowered_programs'])}")
        print(f"other caches:    compiled: {r['cache']['compiled_programs']}; model dirs: {r['cache']['model_dirs']}")
        print(f"models:          model_type {', '.join(r['models']['model_types'])} (orion.models.load); "
              f"random shapes {', '.join(r['models']['random_shapes'])} (orion.models.random)")
        e2e = r["end_to_end"]
        print(f"end to end:      {'ok' if e2e['ok'] else 'FAILED'} "
              + (f"(max error {e2e['max_error']:.3g}, {e2e['ms']} ms)" if "ms" in e2e else e2e.get("error", "")))
        print(f"docs:            {r['docs']}")
    ok = r["end_to_end"]["ok"]
    if probe and not r["backend_error"]:
        from orion import probes

        rep = probes.run()
        text = probes.format_report(rep)
        if rep["backend"] != "ane":
            text = text.replace(f"probes on backend '{rep['backend']}'",
                                f"probes on backend '{rep['backend']}' (emulator rules, not hardware)", 1)
        print(text)
        path = out or f"orion-probe-{rep['backend']}.json"
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(rep, f, indent=2)
        except OSError as exc:
            raise ReportNotWritten(f"--out {path}: cannot write the probe report ({exc.strerror}); "
                                   f"give a path in a writable directory") from None
        if rep["backend"] == "ane":
            print(f"report written to {path}; use it with orion.compile_graph(..., probe_report={path!r})")
        else:
            print(f"report written to {path}: the emulator's answers, which relax nothing; run this on a Mac "
                  f"with the ANE for a report that settles the rules (see README.md, 'Running on a Mac')")
        print(probes.summary(rep, path))
    return 0 if ok else 1
