"""benchmarks/decode_mosaic_report.py on the tiny shape at B = 1: it compiles the decode step
deviceless for the H200 with kernels="mosaic" and "pallas-fused" and writes the JSON and
markdown report: both rows compiled, the Mosaic step launches Mosaic kernels in place of Triton
ones (no more launches than pallas-fused), and every Mosaic kernel has its registers and no
spills. Needs jax >= 0.11 and the CUDA plugin (skipped naming which)."""
from __future__ import annotations

import json
import os

import pytest

from rwkv_jax import deviceless
from rwkv_jax.kernels import MOSAIC_MIN_JAX, jax_version
from tests.gpu_target import PLUGIN_DIR

pytestmark = [
    pytest.mark.skipif(jax_version() < MOSAIC_MIN_JAX, reason="Pallas Mosaic GPU needs jax >= 0.11"),
    pytest.mark.skipif(not any(os.path.isfile(os.path.join(PLUGIN_DIR, f"jax_{name}_plugin", deviceless.MOSAIC_RUNTIME))
                               for name in deviceless.CUDA_PLUGINS),
                       reason=f"no CUDA plugin with {deviceless.MOSAIC_RUNTIME} in {PLUGIN_DIR}"),
]


def test_decode_mosaic_report_tiny(tmp_path, monkeypatch):
    from benchmarks import decode_mosaic_report
    monkeypatch.setenv(deviceless.PLUGIN_DIR_ENV, PLUGIN_DIR)
    # the kernel-level compiles (1.5b sizes there) are tests/pallas_kernels/test_mosaic_lowering.py's
    assert decode_mosaic_report.main(["--shape", "tiny", "--batches", "1", "--kernel-rows", "", "--out",
                                      str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "decode_mosaic_report_tiny_h200.json").read_text())
    assert doc["jax_version"] and doc["date"] and {t["compiled"] for t in doc["table"]} >= {"mosaic", "triton"}
    rows = {r["kernels"]: r for r in doc["rows"]}
    mosaic, fused = rows["mosaic"], rows["pallas-fused"]
    assert mosaic["mosaic_launches"] > 0 and fused["mosaic_launches"] == 0
    assert mosaic["triton_launches"] < fused["triton_launches"] and mosaic["launches"] <= fused["launches"]
    names = {k["name"] for k in mosaic["mosaic_kernels"]}
    assert {"rwkv7_mosaic_shift_mix", "rwkv7_mosaic_segment_linear", "rwkv7_mosaic_wkv_tail"} <= names
    for k in mosaic["mosaic_kernels"]:
        assert k["registers"][0] > 0 and k["max_spill_bytes"] == 0, k
    text = (tmp_path / "decode_mosaic_report_tiny_h200.md").read_text()
    assert "| mosaic | 1 |" in text and "rwkv7_mosaic_wkv_tail" in text
