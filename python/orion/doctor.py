"""``python -m orion doctor``: what this install can do here, and a tiny program run end to end."""

from __future__ import annotations

import json
import platform
import tempfile
import time

import numpy as np

import orion
from orion import models
from orion.errors import OrionError
from orion.program_cache import CacheDirError, cache_dir

TINY = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 64, 1, 384]> x, tensor<fp16, [1, 64, 1, 384]> y) {
        tensor<fp16, [1, 64, 1, 384]> s = add(x=x, y=y)[name=string("s")];
        tensor<fp16, [1, 64, 1, 384]> t = tanh(x=s)[name=string("t")];
    } -> (t);
}
"""


class ReportNotWritten(OrionError):
    """The probe report cannot be written where ``--out`` says."""


def _lowered_cache() -> str:
    try:
        return str(cache_dir() or "off (ORION_CACHE_DIR=off)")
    except CacheDirError as err:
        return f"unusable: {err}"


def report() -> dict:
    info = orion.backend_info()
    frameworks = {name: {"available": ok, "detail": detail} for name, ok, detail in info["backends"]}
    out = {
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "orion": orion.__version__,
        "backend": info["name"],
        "why": info["reason"],
        "ane_client_built": info["ane_client_built"],
        "ane_framework": frameworks.get("ane", {"available": False,
                                                "detail": "not built into this install (needs macOS)"}),
        "framework_path": info["framework_path"],
        "compile_budget": {"used": orion.compile_count(), "limit": orion.compile_budget()},
        "cache": {"compiled_programs": "in-process, by content hash (orion.compiler); the OS caches ANE compiles",
                  "lowered_programs": _lowered_cache(),
                  "model_dirs": tempfile.gettempdir() + "/<hexStringIdentifier> while a program is loaded (ane)"},
        "models": {"model_types": models.model_types(), "random_shapes": models.shape_names()},
    }
    x = np.random.default_rng(0).standard_normal((1, 64, 1, 384)).astype(np.float16)
    y = np.random.default_rng(1).standard_normal((1, 64, 1, 384)).astype(np.float16)
    start = time.perf_counter()
    try:
        with orion.compile(TINY) as p:
            t = p(x=x, y=y)["t"].astype(np.float32)
        err = float(np.max(np.abs(t - np.tanh(x.astype(np.float32) + y.astype(np.float32)))))
        out["end_to_end"] = {"ok": err < 2e-2, "max_error": err, "ms": round((time.perf_counter() - start) * 1e3, 2)}
    except orion.OrionError as e:
        out["end_to_end"] = {"ok": False, "error": str(e)}
    out["compile_budget"]["used"] = orion.compile_count()
    return out


def main(probe: bool = False, out: str | None = None, as_json: bool = False) -> int:
    r = report()
    if as_json:
        print(json.dumps(r, indent=2))
    else:
        print(f"platform:        {r['platform']} (Python {r['python']}, orion {r['orion']})")
        print(f"backend:         {r['backend']}: {r['why']}")
        fw = r["ane_framework"]
        print(f"ANE framework:   {'found' if fw['available'] else 'not found'} ({fw['detail']})")
        print(f"compile budget:  {r['compile_budget']['used']} of {r['compile_budget']['limit']} used")
        print(f"cache:           lowered programs on disk: {r['cache']['lowered_programs']} (ORION_CACHE_DIR); "
              f"compiled: {r['cache']['compiled_programs']}; model dirs: {r['cache']['model_dirs']}")
        print(f"models:          model_type {', '.join(r['models']['model_types'])} (orion.models.load); "
              f"random shapes {', '.join(r['models']['random_shapes'])} (orion.models.random)")
        e2e = r["end_to_end"]
        print(f"end to end:      {'ok' if e2e['ok'] else 'FAILED'} "
              + (f"(max error {e2e['max_error']:.3g}, {e2e['ms']} ms)" if "ms" in e2e else e2e.get("error", "")))
    ok = r["end_to_end"]["ok"]
    if probe:
        from orion import probes

        rep = probes.run()
        print(probes.format_report(rep))
        path = out or f"orion-probe-{rep['backend']}.json"
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(rep, f, indent=2)
        except OSError as exc:
            raise ReportNotWritten(f"--out {path}: cannot write the probe report ({exc.strerror}); "
                                   f"give a path in a writable directory") from None
        print(f"report written to {path}; use it with orion.compile_graph(..., probe_report={path!r})")
    return 0 if ok else 1
