"""The command's flow in-process on the scheduler's numpy FakeEngine (no model): the input is
streamed into the scheduler in a bounded window, every line gets one result, and the results
equal the offline ``scheduler.generate`` API's. (The checkpoint only satisfies the path check.)"""
from __future__ import annotations

import json

import numpy as np

import rwkv7_apps.generate.cli as cli
import rwkv7_apps.scheduler_setup as setup
from scheduler import Request, SamplingParams, Scheduler, generate
from tests.support.scheduler_engines import FakeEngine


def test_input_is_streamed_through_a_window(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(setup, "load_engine", lambda *args, **kwargs: FakeEngine(vocab_size=64, seed=3))
    pending, peak = {"added": 0}, []
    real_add = Scheduler.add

    def counting_add(self, request):
        real_add(self, request)
        pending["added"] += 1
        peak.append(pending["added"] - self.stats.requests_finished)

    monkeypatch.setattr(Scheduler, "add", counting_add)
    rng = np.random.default_rng(9)
    rows = [{"id": f"r{i}", "tokens": rng.integers(1, 64, size=int(rng.integers(1, 12))).tolist(),
             "max_tokens": int(rng.integers(1, 15))} for i in range(40)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows[:20]) + "[]\n"
                   + "".join(json.dumps(r) + "\n" for r in rows[20:]))
    assert cli.main(["--model", str(tiny_ckpt), "--input", str(inp), "--output", str(out), "--max-batch", "3",
                     "--seed", "4"]) == 0
    assert pending["added"] == 40 and max(peak) <= 2 * 3
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == 41 and [r["line"] for r in results if r["finish_reason"] == "error"] == [21]
    expected = generate(FakeEngine(vocab_size=64, seed=3), [
        Request(r["id"], r["tokens"], SamplingParams(max_tokens=r["max_tokens"], seed=cli.request_seed(4, r["id"])))
        for r in rows])
    got = {r["id"]: r for r in results if r["id"] is not None}
    for want in expected:
        assert got[want.id]["tokens"] == want.tokens and got[want.id]["finish_reason"] == want.finish_reason


def test_signal_handlers_are_restored_after_a_run(tiny_ckpt, tmp_path, monkeypatch):
    import signal

    monkeypatch.setattr(setup, "load_engine", lambda *args, **kwargs: FakeEngine(vocab_size=64))
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": 1, "tokens": [3, 4]}) + "\n")
    assert cli.main(["--model", str(tiny_ckpt), "--input", str(inp), "--output", str(tmp_path / "o.jsonl")]) == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
