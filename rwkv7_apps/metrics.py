"""Run metrics for the batch command: aggregate the scheduler's statistics and the run's own
observations into one JSON-ready dict, print it as a table, and plot it (matplotlib, Agg).

Definitions (all times in seconds):
- decode tok/s average: tokens drawn by decode steps / total decode-step time;
  peak: the highest rate over any window of ``PEAK_WINDOW`` consecutive steps.
- prefill tok/s: prompt tokens actually run through the model (prefix-cache hits excluded)
  / total prefill time.
- prefill share: prompt tokens / (prompt + generated tokens) over successful requests.
- TTFT: first token time - arrival time, per request; inter-token latency: the gap between
  consecutive tokens of one request, over all requests' tokens.
- replicas (data parallel): per replica its device, results, generated tokens, decode tok/s
  (as above, over its own steps) and why it failed (null if it did not); with several
  replicas the run's decode tok/s (average and peak) is the sum of theirs, since they
  decode side by side.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import numpy as np

PEAK_WINDOW = 8
"""Consecutive decode steps over which the peak decode rate is measured."""


class StepSeries(NamedTuple):
    """Decode steps as arrays: start time relative to the run start, duration, bucket, live rows."""
    t: np.ndarray
    dt: np.ndarray
    bucket: np.ndarray
    live: np.ndarray


def step_series(stats: dict[str, Any], t0: float) -> StepSeries:
    steps = stats.get("steps", [])
    col = lambda key, dtype: np.asarray([s[key] for s in steps], dtype=dtype)  # noqa: E731
    return StepSeries(col("time", np.float64) - t0, col("seconds", np.float64),
                      col("bucket", np.int64), col("live", np.int64))


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50 and p99 (None when there are no values)."""
    if len(values) == 0:
        return {"p50": None, "p99": None}
    v = np.asarray(values, dtype=np.float64)
    return {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))}


def windowed_rates(series: StepSeries, window: int = PEAK_WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """Decode tok/s over consecutive non-overlapping groups of ``window`` steps:
    (group mid time [G], rate [G])."""
    n = len(series.t)
    if n == 0:
        return np.zeros(0), np.zeros(0)
    starts = np.arange(0, n, window)
    tokens = np.add.reduceat(series.live, starts).astype(np.float64)
    busy = np.add.reduceat(series.dt, starts)
    ends = np.minimum(starts + window, n) - 1
    mid = (series.t[starts] + series.t[ends] + series.dt[ends]) / 2
    return mid, tokens / np.maximum(busy, 1e-12)


def peak_rate(series: StepSeries, window: int = PEAK_WINDOW) -> float | None:
    """Highest decode tok/s over any ``window`` consecutive steps (all steps when fewer)."""
    n = len(series.t)
    if n == 0:
        return None
    w = min(window, n)
    tokens = np.convolve(series.live.astype(np.float64), np.ones(w), mode="valid")
    busy = np.convolve(series.dt, np.ones(w), mode="valid")
    return float(np.max(tokens / np.maximum(busy, 1e-12)))


def build_metrics(stats: dict[str, Any], results: Sequence[dict[str, Any]], itl: Sequence[float],
                  wall_time: float, t0: float, skipped: int = 0,
                  replicas: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The ``--metrics`` JSON.

    stats: ``Scheduler.stats.to_dict()``; results: this run's output records, each with
    ``finish_reason``, ``prompt_tokens``, ``generated_tokens`` and (for requests that reached
    the scheduler) ``ttft``; itl: inter-token gaps; t0: the run's start (perf_counter);
    skipped: input lines already present in the output file from an earlier run;
    replicas: ``rwkv7_apps.replicas.replica_reports`` (device, requests, generated_tokens,
    failed, stats) of each replica.
    """
    ok = [r for r in results if r["finish_reason"] != "error"]
    prompt_tokens = sum(r["prompt_tokens"] for r in ok)
    generated = sum(r["generated_tokens"] for r in results)
    series = step_series(stats, t0)
    decode_tokens = int(series.live.sum())
    decode_time = float(series.dt.sum())
    prefills = stats.get("prefills", [])
    prefilled = sum(p["tokens"] for p in prefills)
    prefill_time = sum(p["seconds"] for p in prefills)
    cache = stats.get("prefix_cache", {})
    lookups = cache.get("hits", 0) + cache.get("misses", 0)
    rows = [replica_row(r, t0) for r in replicas]
    decode_avg = decode_tokens / decode_time if decode_time > 0 else None
    decode_peak = peak_rate(series)
    if len(rows) > 1:
        decode_avg = sum(r["decode_tok_s"] or 0.0 for r in rows)
        decode_peak = sum(peak_rate(step_series(r["stats"], t0)) or 0.0 for r in replicas)
    return {
        "requests": {"total": len(results), "ok": len(ok), "failed": len(results) - len(ok),
                     "skipped_already_done": skipped},
        "tokens": {"prompt": prompt_tokens, "generated": generated, "prefilled": prefilled,
                   "decoded_in_steps": decode_tokens},
        "prefill_tok_s": prefilled / prefill_time if prefill_time > 0 else None,
        "decode_tok_s": {"average": decode_avg, "peak": decode_peak},
        "prefill_share": prompt_tokens / (prompt_tokens + generated) if prompt_tokens + generated else None,
        "ttft_s": percentiles([r["ttft"] for r in results if r.get("ttft") is not None]),
        "inter_token_latency_s": percentiles(itl),
        "wall_time_s": wall_time,
        "decode_steps": len(series.t),
        "bucket_timeline": [{"t": round(float(t), 6), "bucket": int(b)} for t, b in _bucket_changes(series)],
        "compile_events": [_relative(e, t0) for e in stats.get("compiles", [])],
        "bucket_switches": [_relative(e, t0) for e in stats.get("switches", [])],
        "prefix_cache": {"hits": cache.get("hits", 0), "misses": cache.get("misses", 0),
                         "hit_rate": cache.get("hits", 0) / lookups if lookups else None},
        "replicas": rows,
    }


def replica_row(report: dict[str, Any], t0: float) -> dict[str, Any]:
    """One replica's ``replicas`` entry: device, requests, generated_tokens, decode_tok_s, failed."""
    series = step_series(report["stats"], t0)
    busy = float(series.dt.sum())
    return {"device": report["device"], "requests": report["requests"],
            "generated_tokens": report["generated_tokens"],
            "decode_tok_s": float(series.live.sum()) / busy if busy > 0 else None, "failed": report["failed"]}


def _bucket_changes(series: StepSeries) -> list[tuple[float, int]]:
    """(time, bucket) at the first step and at every step whose bucket differs from the last."""
    if len(series.t) == 0:
        return []
    change = np.flatnonzero(np.diff(series.bucket)) + 1
    idx = np.concatenate([[0], change])
    return list(zip(series.t[idx].tolist(), series.bucket[idx].tolist()))


def _relative(event: dict[str, Any], t0: float) -> dict[str, Any]:
    """An event with its absolute ``time`` (perf_counter) made relative to the run start."""
    out = dict(event)
    if isinstance(out.get("time"), (int, float)):
        out["time"] = round(out["time"] - t0, 6)
    return out


def summary_table(m: dict[str, Any]) -> str:
    """A fixed-width, human-readable table of the main numbers."""
    def fmt(v, unit=""):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}{unit}" if abs(v) < 10 else f"{v:,.1f}{unit}"
        return f"{v:,}{unit}"

    req, tok = m["requests"], m["tokens"]
    ms = lambda v: None if v is None else v * 1e3  # noqa: E731
    rows = [
        ("requests ok / failed", f"{req['ok']:,} / {req['failed']:,}"
         + (f"  ({req['skipped_already_done']:,} already done)" if req["skipped_already_done"] else "")),
        ("prompt / generated tokens", f"{tok['prompt']:,} / {tok['generated']:,}"),
        ("prefill tok/s", fmt(m["prefill_tok_s"])),
        ("decode tok/s avg / peak", f"{fmt(m['decode_tok_s']['average'])} / {fmt(m['decode_tok_s']['peak'])}"),
        ("prefill share of tokens", fmt(None if m["prefill_share"] is None else 100 * m["prefill_share"], "%")),
        ("TTFT p50 / p99", f"{fmt(ms(m['ttft_s']['p50']), ' ms')} / {fmt(ms(m['ttft_s']['p99']), ' ms')}"),
        ("inter-token p50 / p99", f"{fmt(ms(m['inter_token_latency_s']['p50']), ' ms')} / "
                                  f"{fmt(ms(m['inter_token_latency_s']['p99']), ' ms')}"),
        ("decode steps / buckets used", f"{m['decode_steps']:,} / "
                                        f"{sorted({e['bucket'] for e in m['bucket_timeline']})}"),
        ("compiles", f"{len(m['compile_events'])} ({fmt(sum(_seconds(e) for e in m['compile_events']), ' s')})"),
        ("prefix-cache hit rate", fmt(None if m["prefix_cache"]["hit_rate"] is None
                                      else 100 * m["prefix_cache"]["hit_rate"], "%")),
        ("wall time", fmt(m["wall_time_s"], " s")),
    ]
    if len(m.get("replicas", [])) > 1:
        rows += [(f"replica {i} ({r['device']})", f"{r['requests']:,} req, {fmt(r['decode_tok_s'])} tok/s"
                  + (f", FAILED: {r['failed']}" if r["failed"] else "")) for i, r in enumerate(m["replicas"])]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def _seconds(event: dict[str, Any]) -> float:
    v = event.get("seconds", 0.0)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0


def plot_run(stats: dict[str, Any], t0: float, path: str, replicas: Sequence[dict[str, Any]] = ()) -> None:
    """Write a PNG: live batch size and bucket (steps) and decode tok/s over time; with
    several ``replicas`` (reports as for ``build_metrics``) each one's live batch and bucket."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = step_series(stats, t0)
    fig, (ax_rows, ax_rate) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    if len(replicas) > 1:
        for i, report in enumerate(replicas):
            own = step_series(report["stats"], t0)
            line, = ax_rows.plot(own.t, own.live, ".", markersize=2, label=f"replica {i} ({report['device']}) live")
            ax_rows.step(own.t, own.bucket, where="post", color=line.get_color(), alpha=0.4, linewidth=1)
    else:
        ax_rows.step(series.t, series.bucket, where="post", label="bucket", color="tab:orange")
        ax_rows.plot(series.t, series.live, ".", markersize=2, label="live rows", color="tab:blue")
    ax_rows.set_ylabel("batch rows")
    ax_rows.legend(loc="upper right")
    mid, rate = windowed_rates(series)
    ax_rate.plot(mid, rate, color="tab:green")
    ax_rate.set_ylabel("decode tok/s")
    ax_rate.set_xlabel("time since start (s)")
    for event in stats.get("compiles", []):
        if isinstance(event.get("time"), (int, float)):
            ax_rows.axvline(event["time"] - t0, color="tab:red", alpha=0.3, linewidth=1)
    fig.suptitle("rwkv7-generate run (red lines: compiles)")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
