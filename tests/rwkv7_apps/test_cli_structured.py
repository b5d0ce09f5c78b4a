"""rwkv7-generate with ``response_format`` per JSONL line (torch backend, tiny random model
with the World vocabulary): constrained lines that finish "stop" validate; a bad schema or
format is that line's error record and the others run."""
from __future__ import annotations

import json

import pytest

from tests.rwkv7_apps.cli_harness import read_results, run_cli, write_jsonl

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {"label": {"enum": ["spam", "ham"]},
                                           "confidence": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["label", "confidence"], "additionalProperties": False}


def test_response_format_per_line(tmp_path):
    fmt = {"type": "json_schema", "json_schema": {"name": "label", "schema": SCHEMA, "strict": True}}
    rows = [{"id": f"s{i}", "prompt": f"Mail {i}", "response_format": fmt, "seed": i} for i in range(4)]
    rows += [{"id": "obj", "prompt": "Any", "response_format": {"type": "json_object"}},
             {"id": "free", "prompt": "Any"},
             {"id": "bad-schema", "prompt": "x", "response_format": {
                 "type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "object", "if": {}}}}},
             {"id": "bad-type", "prompt": "x", "response_format": {"type": "yaml"}}]
    out = tmp_path / "out.jsonl"
    result = run_cli(["--random-model", "tiny-world", "--backend", "torch", "--input", write_jsonl(tmp_path / "in.jsonl", rows),
                      "--output", out, "--max-tokens", "40", "--temperature", "1.0"], tmp_path)
    assert result.returncode == 0, result.stderr
    records = {r["id"]: r for r in read_results(out)}
    assert len(records) == len(rows)
    stopped = [records[f"s{i}"] for i in range(4) if records[f"s{i}"]["finish_reason"] == "stop"]
    assert stopped  # the schema bounds every field
    for r in stopped:
        jsonschema.validate(json.loads(r["text"]), SCHEMA)
    if records["obj"]["finish_reason"] == "stop":
        assert isinstance(json.loads(records["obj"]["text"]), dict)
    assert records["free"]["finish_reason"] in ("stop", "length")
    assert records["bad-schema"]["finish_reason"] == "error" and '"if"' in records["bad-schema"]["error"]
    assert records["bad-type"]["finish_reason"] == "error" and "response_format" in records["bad-type"]["error"]
