"""Text that is not valid Unicode fails alone where it enters (issue 30, item 3 and the UTF-8
part of item 6): a JSONL line with an unpaired surrogate escape or invalid UTF-8 bytes gets an
error record keyed by its line (ids that differ only in bad bytes no longer merge) and a rerun
resumes without crashing; over HTTP such a body gets a 400 naming the field, and the server
keeps serving."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.rwkv7_apps.cli_harness import read_results, run_cli


def test_batch_job_errors_bad_text_by_line_and_resumes(tmp_path):
    rng = np.random.default_rng()
    good = [{"id": f"good{i}", "prompt": f"The {int(rng.integers(1000))} cats", "max_tokens": 3, "temperature": 0}
            for i in range(3)]
    lines = [json.dumps(good[0]).encode(),
             b'{"id": "s1", "prompt": "abc\\ud800def"}',        # lone high surrogate in the prompt
             b'{"id": "s2\\udfff", "tokens": [1, 2]}',           # ... in the id
             b'{"id": "s3", "tokens": [1], "stop": ["x\\udc00"]}',  # ... in a sampling field
             json.dumps(good[1]).encode(),
             b'{"id": "bad\xff", "tokens": [1, 2]}',             # invalid UTF-8: two ids that
             b'{"id": "bad\xfe", "tokens": [1, 2]}',             # replacement would merge
             json.dumps(good[2]).encode()]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(b"\n".join(lines) + b"\n")
    args = ["--random-model", "tiny-world", "--input", inp, "--output", out, "--max-batch", 2, "--prefill", "serial"]
    first = run_cli(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    results = read_results(out)
    errors = {r["line"]: r["error"] for r in results if r["finish_reason"] == "error"}
    assert {r["id"] for r in results if r["finish_reason"] != "error"} == {g["id"] for g in good}
    assert set(errors) == {2, 3, 4, 6, 7} and all(r["id"] is None for r in results if "line" in r)
    assert "prompt: unpaired UTF-16 surrogate U+D800 at character 3" in errors[2]
    assert "id: unpaired UTF-16 surrogate U+DFFF" in errors[3] and "stop[0]" in errors[4]
    assert "invalid UTF-8 at byte 11" in errors[6] and "invalid UTF-8" in errors[7]
    again = run_cli(args, tmp_path)  # everything is done: the rerun resumes, adds nothing
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_results(out) == results


def test_server_answers_400_for_bad_text_and_keeps_serving(tiny_ckpt):
    pytest.importorskip("torch")
    import urllib.error
    import urllib.request

    from rwkv7_apps.engines import load_engine
    from rwkv7_apps.serve.cli import build_app
    from rwkv7_apps.serve.job import Limits
    from scheduler import Scheduler, SchedulerConfig
    from tests.rwkv7_apps.serve_harness import in_process_server

    sched = Scheduler(load_engine("torch", tiny_ckpt, kernels="torch"), SchedulerConfig(max_batch=4))
    app, service = build_app(sched, "m", {"max_tokens": 4}, Limits(64, 16), lambda: True)

    def post(url, raw: bytes):
        request = urllib.request.Request(url + "/completions", raw, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    with in_process_server(app, service) as url:
        for raw, field in [(b'{"prompt": "hi\\ud800"}', "prompt"),
                           (b'{"prompt": [1, 2], "stop": ["a", "\\udc00"]}', "stop[1]"),
                           (b'{"prompt": [1, 2], "b\\ud800d": 1}', "unicode")]:  # a key: pydantic's 400
            status, body = post(url, raw)
            assert status == 400 and field in json.dumps(body["error"]), (raw, status, body)
        status, body = post(url, b'{"prompt": [1, 2, 3], "max_tokens": 3, "stop_token_ids": []}')
        assert status == 200 and body["usage"]["completion_tokens"] == 3
