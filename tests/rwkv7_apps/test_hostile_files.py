"""Sizes checked before work (issue 37, items 7 and 9): a batch line longer than
--max-line-bytes is never held or tokenized and gets an error record naming the limit, the
lines around it keeping their exact greedy tokens."""
from __future__ import annotations

import json

import numpy as np

from tests.rwkv7_apps.cli_harness import read_results, run_cli


def test_batch_job_refuses_a_line_over_the_byte_limit_before_tokenizing(tmp_path):
    rng = np.random.default_rng()
    good = [{"id": f"g{i}", "prompt": f"The {int(rng.integers(1000))} cats", "max_tokens": 4, "temperature": 0}
            for i in range(3)]
    huge = b'{"id": "huge", "prompt": "' + b"word " * 6_000_000  # 30 MB, no closing quote and no newline

    def run(name: str, lines: list[bytes]) -> list[dict]:
        inp, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}-out.jsonl"
        inp.write_bytes(b"\n".join(lines))
        proc = run_cli(["--random-model", "tiny-world", "--input", inp, "--output", out, "--max-batch", 2,
                        "--max-line-bytes", 4096], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return read_results(out)

    plain = run("plain", [json.dumps(g).encode() for g in good])
    hostile = run("hostile", [json.dumps(good[0]).encode(), huge, json.dumps(good[1]).encode(),
                              json.dumps(good[2]).encode(), huge])
    tokens = {r["id"]: r["tokens"] for r in plain}
    assert {r["id"]: r["tokens"] for r in hostile if r["id"] is not None} == tokens
    errors = {r["line"]: r["error"] for r in hostile if r["finish_reason"] == "error"}
    assert errors == {n: f"line {n}: longer than the line limit of 4096 bytes (--max-line-bytes)" for n in (2, 5)}
