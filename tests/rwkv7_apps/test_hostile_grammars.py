"""Hostile grammars fail alone (issue 37, items 1, 2, 3 and 12): a real ``rwkv7-serve``
answers each with a one-line OpenAI-shaped 400 naming the field and the limit, counted in
/metrics, while good requests beside them keep their exact greedy text, /health answers and
the process lives; refused automaton blow-ups are not kept (RSS). In the batch job such a
``response_format`` line gets an error record naming it, the other lines their results, the
job exits 0 and a rerun resumes (it used to die with SIGSEGV on every resume)."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from tests.rwkv7_apps.cli_harness import read_results, run_cli, write_jsonl
from tests.rwkv7_apps.serve_harness import running_server
from tests.scheduler.test_grammar_limits import nested, object_chain, rule_chain

pytest.importorskip("llguidance")


def hostile_bodies(rng: np.random.Generator) -> list[tuple[dict, str, str]]:
    """(body fields, the field named, the limit named) of each attack, sizes drawn afresh."""
    chain = int(rng.integers(2000, 2500))
    return [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": object_chain(chain)}}},
         "response_format", "max_depth=128"),  # overflowed the native stack: SIGSEGV
        ({"guided_grammar": rule_chain(int(rng.integers(3000, 3500)))}, "guided_grammar", "max_rules=1000"),
        ({"guided_choice": [f"c{i}" for i in range(int(rng.integers(100_000, 110_000)))]}, "guided_choice",
         "max_choices=1000"),  # 14 s of a blocked event loop, then a Rust panic
        ({"guided_choice": [f"c{i}" for i in range(int(rng.integers(2001, 2500)))]}, "guided_choice",
         "max_choices=1000"),  # failed at run time
        ({"structured_outputs": {"json": nested(400), "disable_additional_properties": True}}, "structured_outputs",
         "deeper than 512 levels"),  # a plain-text 500
        ({"guided_json": "[" * 10_000 + "]" * 10_000}, "guided_json", "deeper than 512 levels"),  # a plain-text 500
        ({"guided_json": {"$ref": "#"}}, "guided_json", "leads back to itself"),  # a 200 with any text
        ({"guided_json": nested(100)}, "guided_json", "max_depth=128"),
    ]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_server_refuses_each_hostile_grammar_alone(tmp_path):
    rng = np.random.default_rng()
    good = [{"prompt": rng.integers(1, 60000, int(rng.integers(3, 9))).tolist(), "max_tokens": 6, "temperature": 0}
            for _ in range(2)]
    args = ["--random-model", "tiny-world", "--max-batch", "8", "--grammar-max-automaton-mb", "8",
            "--grammar-max-regex-size", "20000"]
    with running_server(args, tmp_path) as server:
        def complete(body: dict) -> tuple[int, dict]:
            status, text = server.post("/v1/completions", json.dumps(body).encode())
            return status, json.loads(text)

        reference = [complete(b)[1]["choices"][0]["text"] for b in good]
        counted = server.metric("rwkv7_http_requests_total", 'endpoint="/v1/completions",status="400"')
        attacks = hostile_bodies(rng)
        answers: list = [None] * len(attacks)
        beside: list = []

        def attack(i: int) -> None:
            answers[i] = complete({"prompt": "Hi", "max_tokens": 4, **attacks[i][0]})

        threads = [threading.Thread(target=attack, args=(i,)) for i in range(len(attacks))]
        for t in threads:
            t.start()
        for b in good:  # good requests while the attacks are in flight
            beside.append(complete(b))
            assert server.get("/health")[0] == 200
        for t in threads:
            t.join()
        for (_, field, limit), (status, body) in zip(attacks, answers):
            message = body["error"]["message"]
            assert status == 400 and body["error"]["param"] == field, (field, status, body)
            assert message.startswith(f"{field}: ") and limit in message and "\n" not in message, message
        assert [b["choices"][0]["text"] for _, b in beside] == reference
        assert server.metric("rwkv7_http_requests_total",
                             'endpoint="/v1/completions",status="400"') == counted + len(attacks)

        # nested-count regexes (each would compile to 9 MB or more): refused before any compile by
        # --grammar-max-regex-size, so nothing of them is kept
        before = rss_mb(server.proc.pid)
        for n in rng.choice(np.arange(30, 40), 4, replace=False).tolist():
            status, body = complete({"prompt": "Hi", "max_tokens": 4, "guided_regex": f"((a{{{n}}}){{{n}}}){{{n}}}"})
            assert status == 400 and "max_regex_size=20000" in body["error"]["message"], body
            assert f"{n ** 3} units" in body["error"]["message"], body
        assert rss_mb(server.proc.pid) - before < 0.75 * 4 * 9, (before, rss_mb(server.proc.pid))

        assert server.get("/health")[0] == 200 and server.proc.poll() is None
        assert [complete(b)[1]["choices"][0]["text"] for b in good] == reference


def test_batch_job_errors_hostile_schemas_by_line_and_resumes(tmp_path):
    rng = np.random.default_rng()
    good = [{"id": f"good{i}", "prompt": f"The {int(rng.integers(1000))} cats", "max_tokens": 3, "temperature": 0}
            for i in range(3)]
    schema = {"type": "json_schema", "json_schema": {"name": "x"}}
    hostile = [{"id": "chain", "prompt": "x", "response_format": {**schema, "json_schema": {
                    "name": "x", "schema": object_chain(int(rng.integers(2000, 2500)))}}},
               {"id": "deep", "prompt": "x", "response_format": {**schema, "json_schema": {
                    "name": "x", "schema": "[" * 10_000 + "]" * 10_000}}},
               {"id": "loop", "prompt": "x", "response_format": {**schema, "json_schema": {
                    "name": "x", "schema": {"$ref": "#"}}}}]
    rows = [good[0], hostile[0], good[1], hostile[1], hostile[2], good[2]]
    inp, out, alone = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "alone.jsonl"
    args = ["--random-model", "tiny-world", "--max-batch", 2, "--prefill", "serial"]
    first = run_cli([*args, "--input", write_jsonl(inp, rows), "--output", out], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    results = {r["id"]: r for r in read_results(out)}
    for name, limit in (("chain", "max_depth=128"), ("deep", "deeper than 512 levels"),
                        ("loop", "leads back to itself")):
        error = results[name]["error"]
        assert results[name]["finish_reason"] == "error" and "response_format: " in error and limit in error, error
    reference = run_cli([*args, "--input", write_jsonl(tmp_path / "good.jsonl", good), "--output", alone], tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert {r["id"]: r["tokens"] for r in read_results(alone)} == {g["id"]: results[g["id"]]["tokens"] for g in good}
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:2]))  # as if stopped after two records: the rerun finishes the rest
    again = run_cli([*args, "--input", inp, "--output", out], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {r["id"]: r for r in read_results(out)} == results
