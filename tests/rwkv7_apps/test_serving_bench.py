"""The serving benchmark: seeded workload, and an end-to-end smoke run writing valid JSON."""
from __future__ import annotations

import json

import numpy as np

from rwkv7_apps.tools.serving_bench import make_workload, run_cli


def test_workload_is_seeded_and_within_bounds():
    a = make_workload(64, (20, 2000), (16, 256), vocab=512, seed=3)
    b = make_workload(64, (20, 2000), (16, 256), vocab=512, seed=3)
    c = make_workload(64, (20, 2000), (16, 256), vocab=512, seed=4)
    assert [r.prompt_tokens for r in a] == [r.prompt_tokens for r in b]
    assert [r.prompt_tokens for r in a] != [r.prompt_tokens for r in c]
    lengths = np.array([len(r.prompt_tokens) for r in a])
    outputs = np.array([r.params.max_tokens for r in a])
    assert lengths.min() >= 20 and lengths.max() <= 2000 and len(set(lengths)) > 32
    assert np.median(lengths) < 600            # log-uniform: most prompts are short
    assert outputs.min() >= 16 and outputs.max() <= 256
    assert all(r.params.stop_tokens == () and r.params.temperature == 0 for r in a)
    assert all(0 < t < 512 for r in a for t in r.prompt_tokens)


def test_smoke_run_writes_valid_json(tmp_path):
    result = run_cli(["--smoke", "--out", str(tmp_path), "--tag", "t"])
    data = json.loads((tmp_path / "serving_t.json").read_text())
    table = (tmp_path / "serving_t.md").read_text()
    assert all(f"\n| {policy} | " in table for policy in ("auto", "serial", "varlen", "mixed"))
    assert (tmp_path / "serving_t.png").stat().st_size > 0
    assert data["same_tokens_all_policies"] is True
    assert set(data["policies"]) == {"auto", "serial", "varlen", "mixed"}
    for policy, r in data["policies"].items():
        assert r["requests"] == 8 and r["finished"] == {"length": 8}, policy
        assert r["generated_tokens"] == sum(result["policies"][policy]["timeline"]["live"]) + 8
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s_avg"] > 0 and r["ttft_p99_s"] >= r["ttft_p50_s"]
        assert 0 < r["prefill_share"] < 1
    assert data["call_ms"]["mixed_step"]["2"] > 0 and data["call_ms"]["varlen_prefill_split"] > 0
    assert "DENSE" in data["policies"]["mixed"]["path_mix"]
    assert "DENSE" not in data["policies"]["serial"]["path_mix"]
