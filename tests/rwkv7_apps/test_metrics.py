"""Metrics aggregation and the run plot, from a synthetic scheduler Stats record."""
from __future__ import annotations

import json

import numpy as np

from rwkv7_apps.metrics import PEAK_WINDOW, build_metrics, plot_run, summary_table
from scheduler.stats import BucketSwitch, CompileEvent, PrefillRecord, Stats, StepRecord


def _random_run(rng, t0=1000.0):
    stats = Stats()
    buckets = [8] * 20 + [4] * 15 + [2] * 10 + [1] * 5
    t = t0 + 0.5
    for b in buckets:
        dt = float(rng.uniform(0.001, 0.01))
        stats.steps.append(StepRecord(t, b, int(rng.integers(1, b + 1)), "BATCHED_DECODE", dt))
        t += dt + float(rng.uniform(0, 0.002))
    stats.compiles += [CompileEvent(t0 + 0.1, 8, 0.3), CompileEvent(t0 + 0.2, 4, 0.2)]
    stats.switches.append(BucketSwitch(t0 + 0.6, 8, 4, 3, 0.001))
    stats.prefills += [PrefillRecord(t0 + 0.01 * i, str(i), int(rng.integers(1, 50)), 0.005) for i in range(10)]
    stats.prefix_hits, stats.prefix_misses = 3, 7
    results = [{"id": str(i), "finish_reason": "length", "prompt_tokens": int(rng.integers(1, 50)),
                "generated_tokens": int(rng.integers(1, 30)), "ttft": float(rng.uniform(0.01, 0.2))}
               for i in range(10)]
    results.append({"id": None, "finish_reason": "error", "prompt_tokens": 0, "generated_tokens": 0})
    return stats, results, t - t0


def test_metrics_fields_and_values(tmp_path):
    rng = np.random.default_rng(11)
    t0 = 1000.0
    stats, results, wall = _random_run(rng, t0)
    itl = rng.uniform(0.001, 0.02, size=200).tolist()
    m = json.loads(json.dumps(build_metrics(stats.to_dict(), results, itl, wall, t0, skipped=2)))
    assert m["requests"] == {"total": 11, "ok": 10, "failed": 1, "skipped_already_done": 2}
    assert m["tokens"]["generated"] == sum(r["generated_tokens"] for r in results)
    assert m["tokens"]["prompt"] == sum(r["prompt_tokens"] for r in results)
    live = np.array([s.live for s in stats.steps], float)
    secs = np.array([s.seconds for s in stats.steps])
    assert np.isclose(m["decode_tok_s"]["average"], live.sum() / secs.sum())
    brute_peak = max(live[i:i + PEAK_WINDOW].sum() / secs[i:i + PEAK_WINDOW].sum()
                     for i in range(len(live) - PEAK_WINDOW + 1))
    assert np.isclose(m["decode_tok_s"]["peak"], brute_peak)
    assert m["decode_tok_s"]["peak"] >= m["decode_tok_s"]["average"]
    assert np.isclose(m["prefill_tok_s"], sum(p.tokens for p in stats.prefills) / (0.005 * 10))
    p = m["tokens"]["prompt"]
    assert np.isclose(m["prefill_share"], p / (p + m["tokens"]["generated"]))
    assert np.isclose(m["ttft_s"]["p50"], np.median([r["ttft"] for r in results[:10]]))
    assert np.isclose(m["inter_token_latency_s"]["p99"], np.percentile(itl, 99))
    assert [e["bucket"] for e in m["bucket_timeline"]] == [8, 4, 2, 1]
    assert m["bucket_timeline"][0]["t"] == 0.5
    assert [e["bucket"] for e in m["compile_events"]] == [8, 4] and np.isclose(m["compile_events"][0]["time"], 0.1)
    assert m["bucket_switches"][0]["to_bucket"] == 4
    assert m["prefix_cache"] == {"hits": 3, "misses": 7, "hit_rate": 0.3}
    assert m["decode_steps"] == 50 and m["wall_time_s"] == wall
    table = summary_table(m)
    assert "10 / 1" in table and "30.0%" in table


def test_metrics_of_an_empty_run_has_no_rates():
    m = build_metrics(Stats().to_dict(), [], [], 0.1, 0.0)
    assert m["decode_tok_s"] == {"average": None, "peak": None} and m["ttft_s"]["p50"] is None
    assert m["prefill_share"] is None and m["bucket_timeline"] == []
    summary_table(m)


def test_plot_writes_a_png(tmp_path):
    stats, _, _ = _random_run(np.random.default_rng(5))
    path = tmp_path / "run.png"
    plot_run(stats.to_dict(), 1000.0, str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
