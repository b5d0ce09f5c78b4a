"""JSONL input parsing and the resumable result writer (no model involved)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rwkv7_apps.generate.jsonl_io import (
    InputError,
    InputRequest,
    ResultWriter,
    error_record,
    item_key,
    read_requests,
    record_key,
)


def _write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_read_requests_classifies_every_line(tmp_path):
    rng = np.random.default_rng(7)
    toks = rng.integers(0, 500, size=5).tolist()
    path = _write_lines(tmp_path / "in.jsonl", [
        json.dumps({"id": "a", "tokens": toks, "temperature": 0.5}),
        "",  # blank lines are skipped but still counted
        "{not json",
        json.dumps({"id": "b", "prompt": "hello"}),
        json.dumps({"id": "a", "tokens": [1]}),
        json.dumps([1, 2]),
        json.dumps({"id": 3, "prompt": "x", "tokens": [1]}),
        json.dumps({"id": True, "tokens": [1]}),
        json.dumps({"id": "c", "tokens": [1, "2"]}),
        json.dumps({"id": 4, "tokens": [9], "stop": ["\n"]}),
    ])
    items = list(read_requests(path))
    assert [it.line for it in items] == [1, 3, 4, 5, 6, 7, 8, 9, 10]
    a, bad_json, b, dup, arr, both, bool_id, bad_tok, four = items
    assert a == InputRequest(1, "a", None, toks, {"temperature": 0.5})
    assert isinstance(bad_json, InputError) and bad_json.id is None and "line 3" in bad_json.message
    assert b == InputRequest(4, "b", "hello", None, {})
    assert isinstance(dup, InputError) and "duplicate id 'a'" in dup.message and "line 1" in dup.message
    assert dup.key == ("line", 5)  # keyed by line: the id belongs to line 1
    assert isinstance(arr, InputError) and "JSON object" in arr.message
    assert isinstance(both, InputError) and "exactly one" in both.message and both.key == ("id", 3)
    assert isinstance(bool_id, InputError) and bool_id.key == ("line", 8)
    assert isinstance(bad_tok, InputError) and "list of integers" in bad_tok.message
    assert four == InputRequest(10, 4, None, [9], {"stop": ["\n"]})
    rec = error_record(dup)
    assert rec["finish_reason"] == "error" and rec["line"] == 5 and record_key(rec) == ("line", 5)
    assert "line" not in error_record(both)


def test_writer_resumes_and_cuts_a_torn_line(tmp_path):
    path = tmp_path / "out.jsonl"
    rng = np.random.default_rng(3)
    records = [{"id": f"r{i}", "tokens": rng.integers(0, 100, size=i).tolist(), "finish_reason": "length",
                "prompt_tokens": 1, "generated_tokens": i} for i in range(5)]
    with ResultWriter(path, group=2) as w:
        assert w.done == set() and w.records_before == 0
        for r in records[:3]:
            w.write(r)
        w.write({"id": None, "line": 9, "tokens": [], "finish_reason": "error", "error": "x",
                 "prompt_tokens": 0, "generated_tokens": 0})
    good = path.read_bytes()
    path.write_bytes(good + json.dumps(records[3]).encode()[:17])  # killed mid-write
    with ResultWriter(path) as w:
        assert w.torn_bytes == 17 and w.records_before == 4
        assert w.done == {("id", "r0"), ("id", "r1"), ("id", "r2"), ("line", 9)}
        assert path.read_bytes() == good
        w.write(records[4])
    lines = path.read_text().splitlines()
    assert [json.loads(x) for x in lines][-1] == records[4] and len(lines) == 5


def test_writer_cuts_a_garbled_terminated_last_line_but_refuses_garbage_inside(tmp_path):
    path = tmp_path / "out.jsonl"
    ok = json.dumps({"id": "a", "tokens": [1], "finish_reason": "stop"}) + "\n"
    path.write_text(ok + "\x00\x00\x00\n")
    with ResultWriter(path) as w:
        assert w.done == {("id", "a")} and w.torn_bytes == 4
    assert path.read_text() == ok
    path.write_text("garbage\n" + ok)
    with pytest.raises(ValueError, match="not a result record"):
        ResultWriter(path)


def test_writer_fsyncs_in_groups(tmp_path, monkeypatch):
    calls = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd)))
    with ResultWriter(tmp_path / "o.jsonl", group=3, interval=3600) as w:
        for i in range(7):
            w.write({"id": i, "tokens": []})
        assert len(calls) == 2  # after records 3 and 6
    assert len(calls) == 3  # close syncs the tail


def test_a_second_writer_on_the_same_file_is_refused(tmp_path):
    path = tmp_path / "out.jsonl"
    with ResultWriter(path) as w:
        w.write({"id": "a", "tokens": []})
        with pytest.raises(ValueError, match="another process"):
            ResultWriter(path)
    with ResultWriter(path) as again:  # released on close
        assert again.done == {("id", "a")}


def test_resume_scan_reads_the_same_keys_as_a_full_parse(tmp_path):
    rng = np.random.default_rng()
    ids = ["plain", 'quo"te', "back\\slash", "ünï", "a, b", 17, -3, 0, "line"]
    ids += [f"r{i}" for i in rng.integers(0, 10**6, 20)] + [int(i) for i in rng.integers(-10**9, 10**9, 20)]
    path = tmp_path / "out.jsonl"
    with ResultWriter(path) as w:
        for i, rid in enumerate(ids):
            w.write({"id": rid, "tokens": rng.integers(0, 9, int(rng.integers(0, 4))).tolist(),
                     "text": 'say "line": 3', "finish_reason": "length", "prompt_tokens": 1, "generated_tokens": 1})
            if i % 7 == 0:
                w.write({"id": rid, "tokens": [], "finish_reason": "error", "error": "dup", "prompt_tokens": 0,
                         "generated_tokens": 0, "line": 100 + i})
    with ResultWriter(path) as w:
        assert w.done == {record_key(json.loads(x)) for x in path.read_text().splitlines()}
        assert ("id", 'quo"te') in w.done and ("line", 100) in w.done and ("id", -3) in w.done


def test_skipping_done_keys_yields_none_and_keeps_duplicate_detection(tmp_path):
    rows = [json.dumps({"id": "a", "tokens": [1]}), json.dumps({"id": "b", "tokens": "bad"}),
            json.dumps({"id": "a", "tokens": [2]}), "{broken", json.dumps({"id": 5, "prompt": "x"})]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(rows) + "\n")
    full = list(read_requests(path))
    done = {("id", "a"), ("id", "b")}
    skipped = list(read_requests(path, skip=done))
    assert skipped[:2] == [None, None]
    assert [x for x in skipped if x is not None] == [x for x in full if item_key(x) not in done]
    done_all = {item_key(x) for x in full}
    assert list(read_requests(path, skip=done_all)) == [None] * len(full)  # a finished job: all skipped
    assert isinstance(skipped[2], InputError) and "duplicate" in skipped[2].message


@pytest.mark.parametrize("last_newline", [True, False])
def test_a_line_over_the_byte_limit_is_never_held(tmp_path, last_newline):
    """A 20 MB line (the issue's was 200 MB, tokenized whole) is an error record naming the limit,
    read in bounded chunks: the lines around it parse as before and the peak stays small."""
    import tracemalloc

    rng = np.random.default_rng()
    toks = rng.integers(0, 500, size=8).tolist()
    huge = '{"id": "h", "prompt": "' + "ab" * 10_000_000
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "a", "tokens": toks}) + "\n" + huge + "\n"
                    + json.dumps({"id": "b", "tokens": toks[::-1]}) + "\n" + huge + ("\n" if last_newline else ""))
    limit = len(json.dumps({"id": "b", "tokens": toks[::-1]}))
    tracemalloc.start()
    items = list(read_requests(path, max_line_bytes=limit))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 << 20
    a, long1, b, long2 = items
    assert a.tokens == toks and b.tokens == toks[::-1]
    for item, line in ((long1, 2), (long2, 4)):
        assert isinstance(item, InputError) and item.key == ("line", line)
        assert f"line {line}: longer than the line limit of {limit} bytes (--max-line-bytes)" == item.message
    assert list(read_requests(path, skip={("id", "a"), ("line", 2)}, max_line_bytes=limit))[:2] == [None, None]
