"""benchmarks/multi_turn.py --smoke, run as the script it is: two real rwkv7-serve
subprocesses (turn cache on, off) driven over HTTP chat completions on the same short
conversations."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.single_stack
def test_multi_turn_smoke_prefills_only_the_new_tokens_with_the_same_replies(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "multi_turn.py"), "--smoke",
                             "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "multi_turn_smoke.json").read_text())
    on, off = results["on"], results["off"]
    assert results["identical"] and len(on["records"]) == 2 and all(len(c) == 3 for c in on["records"])
    for turn_on, turn_off in zip(on["turns"][1:], off["turns"][1:]):
        # after turn 1 the cache serves the whole history but the reply's last (never fed) token
        assert turn_on["new_tokens"] <= turn_on["computed_tokens"] <= turn_on["new_tokens"] + 1
        assert turn_on["hit_share"] == 1.0
        assert turn_off["computed_tokens"] == turn_off["prompt_tokens"] > turn_on["computed_tokens"]
    assert on["hit_share_after_turn_1"] == 1.0 and off["hit_share_after_turn_1"] == 0.0
    assert "replies identical with and without the cache: True" in (tmp_path / "multi_turn_smoke.md").read_text()
