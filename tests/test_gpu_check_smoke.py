"""benchmarks/gpu_check.py --smoke: every CPU-side piece of the GPU script runs on tiny shapes
(interpret-mode kernels) and writes a complete JSON + markdown report."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import gpu_check


def test_gpu_check_smoke_writes_a_complete_report(tmp_path):
    gpu_check.main(["--smoke", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["smoke"] and results["interpret"]
    parity = results["parity"]
    assert parity["ok"], parity
    assert parity["kernels"] and parity["sparse"] and parity["models"]
    assert results["roofline"]["copy_GBps"] > 0 and results["roofline"]["bf16_matmul_TFLOPs"] > 0
    for row in results["kernels"]:
        assert row["pallas_us"] > 0 and row["xla_us"] > 0
    assert "value_sparse_us" in results["kernels"][-1]
    assert results["measured_sparse_max_rows"] in (0, 1)
    models = results["models"]
    assert {(r["B"], r["T"]) for r in models} == {(1, 1), (1, 8)}
    for row in models:
        assert row["tok_s"] > 0 and math.isfinite(row["roofline_fraction"])
    assert set(results["goals"]) and results["serving"]["status"] in ("absent", "skipped in --smoke")
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "## Parity: all ok" in markdown and "## Models" in markdown


def test_gpu_check_refuses_a_full_run_without_gpu(tmp_path):
    with pytest.raises(SystemExit, match="needs a GPU"):
        gpu_check.main(["--out", str(tmp_path)])


def test_sparse_threshold_is_the_largest_winning_row_count():
    rows = [{"case": f"channel_mix M={m}", "value_sparse_us": s, "value_dense_xla_us": 10.0}
            for m, s in ((1, 5.0), (2, 9.0), (4, 12.0), (8, 30.0))] + [{"case": "linear M=1"}]
    assert gpu_check.sparse_rows_threshold(rows) == 2
    assert gpu_check.sparse_rows_threshold(rows[2:]) == 0
    assert gpu_check.sparse_rows_threshold([]) is None


def test_roofline_accounting_counts_weights_state_and_flops():
    config = gpu_check.named_config("tiny")
    c = config
    params_bytes = 4 * c.n_params
    nbytes, flops = gpu_check.step_bytes_and_flops(config, params_bytes, 4, B=2, T=1)
    emb = c.vocab_size * c.n_embd
    state = c.n_layer * (2 * c.n_embd * 4 + c.n_head * c.head_size ** 2 * 4)
    assert nbytes == params_bytes - 4 * emb + 2 * c.n_embd * 4 + 2 * 2 * state
    assert flops == 2 * 2 * (c.n_params - emb) + 6 * 2 * c.n_layer * c.n_head * c.head_size ** 2
