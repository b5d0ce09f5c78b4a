"""A bounded load run with a real load generator: guidellm (``guidellm run``, its
openai_http backend, streamed chat completions) sends 100 requests at concurrency 8 to a
real rwkv7-serve on loopback; its own JSON report shows 0 errored and 0 incomplete
requests, and its output-token total equals the server's generated-token counter."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.rwkv7_apps.serve_harness import running_server

pytest.importorskip("guidellm")

REQUESTS, CONCURRENCY, MAX_TOKENS = 100, 8, 4
WORDS = "red green blue cat dog tree river stone cloud seven paper light".split()


def test_guidellm_streamed_chat_load_has_no_errors(tmp_path):
    rng = np.random.default_rng()
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": " ".join(rng.choice(WORDS, int(rng.integers(1, 80))))}) + "\n"
                            for _ in range(REQUESTS)))
    report = tmp_path / "report.json"
    with running_server(["--random-model", "tiny-world", "--max-batch", CONCURRENCY, "--max-tokens", MAX_TOKENS,
                         "--served-model-name", "m"], tmp_path) as server:
        run = subprocess.run(
            [sys.executable, "-m", "guidellm", "run", "--backend", f"kind=openai_http,target={server.url},model=m",
             "--profile", f"kind=concurrent,streams={CONCURRENCY}",
             "--constraint", f"kind=max_requests,count={REQUESTS}",
             "--data", f"kind=json_file,path={data}", "--output", f"kind=json,path={report}",
             "--disable-console-interactive"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        generated = server.metric("rwkv7_generated_tokens_total")
        served = server.metric("rwkv7_http_requests_total", 'endpoint="/v1/chat/completions",status="200"')
    metrics = json.loads(report.read_text())["benchmarks"][0]["metrics"]
    totals = metrics["request_totals"]
    assert (totals["successful"], totals["errored"], totals["incomplete"]) == (REQUESTS, 0, 0)
    assert served == REQUESTS
    assert metrics["output_token_count"]["successful"]["total_sum"] == generated > 0
