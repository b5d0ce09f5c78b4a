"""The results dict of a run and the sections' runner: written atomically as gpu_check.json
and gpu_check.md after every section and every item of a long one."""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import time
import types
from pathlib import Path as FsPath

import jax
import numpy as np

from benchmarks.gpu_checks.common import attempt, failures
from benchmarks.gpu_checks.markdown import markdown
from benchmarks.gpu_checks.summary import summary


class Report:
    """The results dict, written atomically as gpu_check.json and gpu_check.md by save()."""

    def __init__(self, out_dir: FsPath, start: float, results: dict):
        self.out_dir, self.start, self.results = out_dir, start, results
        results["sections"] = {}

    def save(self) -> None:
        """The JSON first; a bug in the summary or the markdown must not cost the measurements."""
        self.results["summary"] = attempt({}, summary, self.results["sections"])
        self._write("gpu_check.json", json.dumps(self.results, indent=1, default=str))
        try:
            text = markdown(self.results)
        except Exception as e:
            text = f"markdown failed ({type(e).__name__}: {e}); the results are in gpu_check.json\n"
        self._write("gpu_check.md", text)

    def _write(self, name: str, text: str) -> None:
        tmp = self.out_dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.out_dir / name)

    def section(self, name: str, fn, *args) -> dict:
        """Run section fn(*args): a dict, or a generator of dicts (one per item) merged into
        the section's results, each followed by a save; then its status and seconds."""
        part = self.results["sections"][name] = {"status": "running"}
        self.save()
        start = time.perf_counter()
        try:
            got = fn(*args)
            for update in (got if isinstance(got, types.GeneratorType) else (got,)):
                part.update(update)
                self.save()
        except Exception as e:  # recorded; the next sections still run
            part["error"] = f"{type(e).__name__}: {str(e)[:600]}"
        part["seconds"] = round(time.perf_counter() - start, 2)
        if part["status"] == "running":
            bad = failures(part)
            part["status"] = "failed" if bad else "ok"
            if bad:
                part["reason"] = part.get("error", f"{bad} failing entries")
        self.save()
        print(f"[{time.perf_counter() - self.start:6.1f} s] {name}: {part['status']} in {part['seconds']} s "
              f"{part.get('reason') or ''}", flush=True)
        return part


def environment() -> dict:
    versions = {"python": platform.python_version(), "jax": jax.__version__, "numpy": np.__version__}
    for dist in ("jaxlib", "flax", "torch", "triton"):  # not imported: torch stays out of this process
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:  # optional on the machine; record its absence
            versions[dist] = None
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "backend": jax.default_backend(), "devices": [d.device_kind for d in jax.devices()],
            "versions": versions}
