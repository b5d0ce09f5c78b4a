"""Metrics aggregation and the run plot, from a synthetic scheduler Stats record."""
from __future__ import annotations

import json

import numpy as np

from rwkv7_apps.generate.metrics import COMPILE_COLORS, PEAK_WINDOW, RunCounts, build_metrics, plot_run, summary_table
from scheduler.stats import BucketSwitch, CompileEvent, PrefillRecord, RequestRecord, Stats


def _random_run(rng, t0=1000.0):
    stats = Stats()
    buckets = [8] * 20 + [4] * 15 + [2] * 10 + [1] * 5
    t = t0 + 0.5
    steps = []
    for b in buckets:
        dt = float(rng.uniform(0.001, 0.01))
        wanted = b // 2 if b > 1 and rng.random() < 0.3 else 0  # a smaller bucket was still compiling
        steps.append((t, b, int(rng.integers(1, b + 1)), "BATCHED_DECODE", dt, wanted))
        stats.record_step(*steps[-1])
        t += dt + float(rng.uniform(0, 0.002))
    stats.set_role("decode")
    stats.record_compile(CompileEvent(t0 + 0.1, "step:8", 0.3))
    stats.set_role("ahead")
    stats.record_compile(CompileEvent(t0 + 0.6, "prefill:16", 0.2))
    stats.record_switch(BucketSwitch(t0 + 0.05, 0, 8, 0, 0.002, 0.3))
    stats.record_switch(BucketSwitch(t0 + 0.6, 8, 4, 3, 0.001, 0.004))
    for i in range(10):
        stats.record_prefill(PrefillRecord(t0 + 0.01 * i, str(i), int(rng.integers(1, 50)), 0.005))
    stats.record_prefix_lookups(3, 7, hit_tokens=40)
    stats.record_turn_state()
    counts, ttfts = RunCounts(), []
    for i in range(10):
        record = {"finish_reason": "length", "prompt_tokens": int(rng.integers(1, 50)),
                  "generated_tokens": int(rng.integers(1, 30))}
        ttfts.append(float(rng.uniform(0.01, 0.2)))
        counts.add(record)
        stats.record_request(RequestRecord(str(i), record["prompt_tokens"], 0, 0.01, ttfts[-1],
                                           record["generated_tokens"], "length", t0, t))
    counts.add({"finish_reason": "error", "prompt_tokens": 0, "generated_tokens": 0})
    return stats, counts, steps, ttfts, t - t0


def test_metrics_fields_and_values(tmp_path):
    rng = np.random.default_rng(11)
    t0 = 1000.0
    stats, counts, steps, ttfts, wall = _random_run(rng, t0)
    itl = rng.uniform(0.001, 0.02, size=200)
    stats.inter_token.add_many(itl)
    m = json.loads(json.dumps(build_metrics(stats, counts, wall, t0, skipped=2)))
    assert m["requests"] == {"total": 11, "ok": 10, "failed": 1, "skipped_already_done": 2}
    assert m["tokens"]["generated"] == counts.generated_tokens and m["tokens"]["prompt"] == counts.prompt_tokens
    live = np.array([s[2] for s in steps], float)
    secs = np.array([s[4] for s in steps])
    assert np.isclose(m["decode_tok_s"]["average"], live.sum() / secs.sum())
    brute_peak = max(live[i:i + PEAK_WINDOW].sum() / secs[i:i + PEAK_WINDOW].sum()
                     for i in range(len(live) - PEAK_WINDOW + 1))
    assert np.isclose(m["decode_tok_s"]["peak"], brute_peak)
    assert m["decode_tok_s"]["peak"] >= m["decode_tok_s"]["average"]
    assert np.isclose(m["prefill_tok_s"], sum(p.tokens for p in stats.prefills) / (0.005 * 10))
    p = m["tokens"]["prompt"]
    assert np.isclose(m["prefill_share"], p / (p + m["tokens"]["generated"]))
    bound = m["percentiles_relative_error"]
    assert bound == 0.01
    exact_ttft = np.percentile(ttfts, 50, method="lower")
    assert abs(m["ttft_s"]["p50"] - exact_ttft) <= bound * exact_ttft
    exact_itl = np.percentile(itl, 99, method="lower")
    assert abs(m["inter_token_latency_s"]["p99"] - exact_itl) <= bound * exact_itl
    assert [e["bucket"] for e in m["bucket_timeline"]] == [8, 4, 2, 1]
    assert m["bucket_timeline"][0]["t"] == 0.5
    assert [e["what"] for e in m["compile_events"]] == ["step:8", "prefill:16"]
    assert np.isclose(m["compile_events"][0]["time"], 0.1) and np.isclose(m["compile_seconds"], 0.5)
    assert [s["to_bucket"] for s in m["bucket_switches"]] == [8, 4]
    assert m["bucket_switches"][1]["compile_wait"] == 0.004
    # compile time split by thread: the decode thread waited for step:8, prefill:16 ran ahead
    assert [e["thread"] for e in m["compile_events"]] == ["decode", "ahead"]
    assert np.isclose(m["compile_seconds_waited"], 0.3) and np.isclose(m["compile_seconds_hidden"], 0.2)
    assert np.isclose(sum(m["compile_seconds_by_thread"].values()), m["compile_seconds"])
    assert m["kept_steps"] == sum(1 for s in steps if s[5]) and m["compile_ahead_failures"] == 0
    assert np.isclose(m["switch_wait_max_s"], 0.005)  # from a decoding batch only (not 0 -> 8)
    assert m["prefix_cache"] == {"hits": 3, "misses": 7, "removed": 0, "hit_tokens": 40, "turn_states": 1,
                                 "hit_rate": 0.3}
    assert m["decode_steps"] == 50 and m["wall_time_s"] == wall
    table = summary_table(m)
    assert "10 / 1" in table and "30.0%" in table
    assert any(line.split()[:2] == ["compile", "time"] and "0.500 s" in line for line in table.splitlines())


def test_metrics_of_an_empty_run_has_no_rates():
    m = build_metrics(Stats(), RunCounts(), 0.1, 0.0)
    assert m["decode_tok_s"] == {"average": None, "peak": None} and m["ttft_s"]["p50"] is None
    assert m["prefill_share"] is None and m["bucket_timeline"] == [] and m["compile_seconds"] == 0
    summary_table(m)


def test_plot_writes_a_png(tmp_path):
    stats = _random_run(np.random.default_rng(5))[0]
    path = tmp_path / "run.png"
    plot_run(stats, 1000.0, str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    # both kinds of compile are shaded: the one the decode thread waited for, the one ahead
    import matplotlib.colors
    import matplotlib.image
    pixels = matplotlib.image.imread(str(path))[..., :3]
    for thread in ("decode", "ahead"):
        shade = 0.25 * np.array(matplotlib.colors.to_rgb(COMPILE_COLORS[thread])) + 0.75
        assert (np.abs(pixels - shade).max(axis=-1) < 0.02).sum() > 500, thread
