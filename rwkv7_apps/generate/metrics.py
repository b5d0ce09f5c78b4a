"""Run metrics for the batch command: the scheduler's bounded statistics (scheduler/stats.py)
and the run's own counts as one JSON-ready dict, printed as a table and plotted (matplotlib, Agg).

Definitions (all times in seconds):
- decode tok/s average: tokens drawn by decode steps / total decode-step time; peak: the
  highest rate over any ``PEAK_WINDOW`` consecutive steps. Compile time is excluded.
- prefill tok/s: prompt tokens actually run through the model (prefix-cache hits excluded)
  / total prefill time, compile time excluded.
- compile seconds: every compile (decode buckets, slot and resize executables, prefill
  pieces, varlen/mixed shapes), ahead of time or lazily during the run; split by the thread
  that ran it (scheduler/stats.py): ``compile_seconds_waited`` the decode thread waited for
  (the critical path: its own compiles, and its time blocked on one in progress elsewhere),
  ``compile_seconds_hidden`` compiled ahead while the batch decoded.
- kept steps: decode steps run in another bucket than their rows wanted because that one
  was still compiling (padded rows, or ready rows waiting); switch wait: the decode thread's
  time in a bucket switch from a decoding batch, compiles waited for included.
- prefill share: prompt tokens / (prompt + generated tokens) over successful requests.
- prefill calls: engine calls that ran prompt pieces, by kind ("serial": one prompt at
  B=1, "varlen": flattened pieces of several, "mixed": pieces inside a decode step), so
  the prefill policy at work shows (auto: serial and varlen calls; serial only on an
  engine without Capability.VARLEN_PREFILL).
- TTFT: first token time - arrival time, per request (wall time: compiles included);
  inter-token latency: the gap between consecutive tokens of one request. Their p50/p99
  come from log histograms: within ``percentiles_relative_error`` (1%) of the exact order
  statistic of rank floor(q (n - 1)).
- bucket_timeline: the bucket at the run's first step and at every change, from the
  downsampled step timeline (at most ``Stats.timeline.max_points`` windows).
- replicas (data parallel): per replica its device, results, generated tokens, decode tok/s
  (as above, over its own steps) and why it failed (null if it did not); with several
  replicas the run's decode tok/s (average and peak) is the sum of theirs, since they
  decode side by side.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from scheduler.stats import PEAK_WINDOW, RELATIVE_ERROR, Stats

__all__ = ["COMPILE_COLORS", "PEAK_WINDOW", "RunCounts", "build_metrics", "plot_run", "summary_table",
           "timeline_series"]

COMPILE_COLORS = {"decode": "tab:red", "ahead": "tab:gray", "prefill": "tab:orange", "precompile": "tab:purple"}
"""The plot's shade of a compile, by the thread that ran it (``CompileEvent.thread``)."""


class RunCounts:
    """The command's own per-result counts (input-line errors included), in O(1) memory."""

    def __init__(self):
        self.total = self.ok = self.prompt_tokens = self.generated_tokens = 0

    def add(self, record: dict[str, Any]) -> None:
        """Count one output record (``finish_reason``, ``prompt_tokens``, ``generated_tokens``)."""
        self.total += 1
        self.generated_tokens += record["generated_tokens"]
        if record["finish_reason"] != "error":
            self.ok += 1
            self.prompt_tokens += record["prompt_tokens"]


class TimelineSeries(NamedTuple):
    """Downsampled decode steps: per window its start relative to the run start, its span,
    bucket, mean live rows and decode tok/s."""
    t: np.ndarray
    span: np.ndarray
    bucket: np.ndarray
    live: np.ndarray
    rate: np.ndarray


def timeline_series(stats: Stats, t0: float) -> TimelineSeries:
    w = stats.timeline.points()
    col = lambda f, dtype=np.float64: np.asarray([f(x) for x in w], dtype)  # noqa: E731
    steps = np.maximum(col(lambda x: x.steps), 1)
    return TimelineSeries(col(lambda x: x.start) - t0, col(lambda x: x.end - x.start),
                          col(lambda x: x.bucket, np.int64), col(lambda x: x.tokens) / steps,
                          col(lambda x: x.tokens) / np.maximum(col(lambda x: x.seconds), 1e-12))


def build_metrics(stats: Stats, counts: RunCounts, wall_time: float, t0: float,
                  skipped: int = 0, replicas: Sequence[dict[str, Any]] = (),
                  engine: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``--metrics`` JSON. engine: what ran ({"kernels", "dtype", "state_dtype"}: the engine's
    resolved kernel set, e.g. "pallas-fused" or the "pallas" a failed self-check fell back to, its
    weights' dtype and its wkv state's dtype); stats: the scheduler's ``Stats`` (a replica set's merged);
    counts: this run's output records; t0: the run's start (perf_counter); skipped: input
    lines already present in the output file from an earlier run; replicas:
    ``scheduler.replicas.build.replica_reports`` (device, requests, generated_tokens, failed,
    stats: a Stats) of each replica."""
    prompt, generated = counts.prompt_tokens, counts.generated_tokens
    lookups = stats.prefix_hits + stats.prefix_misses
    rows = [replica_row(r) for r in replicas]
    decode_avg, decode_peak = stats.decode_tok_s, stats.decode_tok_s_peak
    if len(rows) > 1:
        decode_avg = sum(r["decode_tok_s"] or 0.0 for r in rows)
        decode_peak = sum(r["stats"].decode_tok_s_peak or 0.0 for r in replicas)
    return {
        "engine": engine,
        "requests": {"total": counts.total, "ok": counts.ok, "failed": counts.total - counts.ok,
                     "skipped_already_done": skipped},
        "tokens": {"prompt": prompt, "generated": generated, "prefilled": stats.prefill_tokens,
                   "decoded_in_steps": stats.decode_tokens},
        "prefill_tok_s": stats.prefill_tok_s,
        "prefill_calls": dict(sorted(stats.prefill_calls.items())),
        "decode_tok_s": {"average": decode_avg, "peak": decode_peak},
        "compile_seconds": stats.compile_seconds,
        "compile_seconds_waited": stats.compile_seconds_waited,
        "compile_seconds_hidden": stats.compile_seconds_hidden,
        "compile_seconds_by_thread": dict(sorted(stats.compile_seconds_by_thread.items())),
        "compile_ahead_failures": stats.ahead_failures,
        "kept_steps": stats.kept_steps,
        "switch_wait_max_s": max((s.seconds + s.compile_wait for s in stats.switches if s.from_bucket), default=None),
        "prefill_share": prompt / (prompt + generated) if prompt + generated else None,
        "ttft_s": stats.ttft.percentiles(),
        "inter_token_latency_s": stats.inter_token.percentiles(),
        "decode_step_s": stats.step_seconds.percentiles(),
        "percentiles_relative_error": RELATIVE_ERROR,
        "wall_time_s": wall_time,
        "decode_steps": stats.decode_steps,
        "bucket_timeline": _bucket_changes(stats, t0),
        "compile_events": [_relative(e._asdict(), t0) for e in stats.compiles],
        "bucket_switches": [_relative(e._asdict(), t0) for e in stats.switches],
        "prefix_cache": {"hits": stats.prefix_hits, "misses": stats.prefix_misses,
                         "removed": stats.prefix_removed, "hit_tokens": stats.prefix_hit_tokens,
                         "turn_states": stats.turn_states,
                         "hit_rate": stats.prefix_hits / lookups if lookups else None},
        "replicas": rows,
    }


def replica_row(report: dict[str, Any]) -> dict[str, Any]:
    """One replica's ``replicas`` entry: device, requests, generated_tokens, decode_tok_s, failed."""
    return {"device": report["device"], "requests": report["requests"],
            "generated_tokens": report["generated_tokens"], "decode_tok_s": report["stats"].decode_tok_s,
            "failed": report["failed"]}


def _bucket_changes(stats: Stats, t0: float) -> list[dict[str, Any]]:
    """{"t", "bucket"} at the first window and at every window whose bucket differs from the last."""
    out: list[dict[str, Any]] = []
    for w in stats.timeline.points():
        if not out or out[-1]["bucket"] != w.bucket:
            out.append({"t": round(w.start - t0, 6), "bucket": int(w.bucket)})
    return out


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
        ("engine kernels / dtype", "-" if m.get("engine") is None else f"{m['engine']['kernels']} / {m['engine']['dtype']}"),
        ("requests ok / failed", f"{req['ok']:,} / {req['failed']:,}"
         + (f"  ({req['skipped_already_done']:,} already done)" if req["skipped_already_done"] else "")),
        ("prompt / generated tokens", f"{tok['prompt']:,} / {tok['generated']:,}"),
        ("prefill tok/s (no compiles)", fmt(m["prefill_tok_s"])),
        ("prefill calls", ", ".join(f"{kind} {n:,}" for kind, n in m["prefill_calls"].items()) or "-"),
        ("decode tok/s avg / peak", f"{fmt(m['decode_tok_s']['average'])} / {fmt(m['decode_tok_s']['peak'])}"),
        ("prefill share of tokens", fmt(None if m["prefill_share"] is None else 100 * m["prefill_share"], "%")),
        ("TTFT p50 / p99", f"{fmt(ms(m['ttft_s']['p50']), ' ms')} / {fmt(ms(m['ttft_s']['p99']), ' ms')}"),
        ("inter-token p50 / p99", f"{fmt(ms(m['inter_token_latency_s']['p50']), ' ms')} / "
                                  f"{fmt(ms(m['inter_token_latency_s']['p99']), ' ms')}"),
        ("decode steps / buckets used", f"{m['decode_steps']:,} / "
                                        f"{sorted({e['bucket'] for e in m['bucket_timeline']})}"),
        ("compiles", f"{len(m['compile_events']):,}"),
        ("compile time", fmt(m["compile_seconds"], " s")),
        ("  decode waited / ahead", f"{fmt(m['compile_seconds_waited'], ' s')} / {fmt(m['compile_seconds_hidden'], ' s')}"),
        ("steps kept (compiling) / switch wait max", f"{m['kept_steps']:,} / {fmt(ms(m['switch_wait_max_s']), ' ms')}"),
        ("prefix-cache hit rate", fmt(None if m["prefix_cache"]["hit_rate"] is None
                                      else 100 * m["prefix_cache"]["hit_rate"], "%")),
        ("wall time", fmt(m["wall_time_s"], " s")),
    ]
    if len(m.get("replicas", [])) > 1:
        rows += [(f"replica {i} ({r['device']})", f"{r['requests']:,} req, {fmt(r['decode_tok_s'])} tok/s"
                  + (f", FAILED: {r['failed']}" if r["failed"] else "")) for i, r in enumerate(m["replicas"])]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def plot_run(stats: Stats, t0: float, path: str, replicas: Sequence[dict[str, Any]] = ()) -> None:
    """Write a PNG: bucket and mean live rows, and decode tok/s, per timeline window over
    time (with several ``replicas``, reports as for ``build_metrics``, each one's); every
    compile shaded over its duration by the thread that ran it (``COMPILE_COLORS``: red where
    the decode thread waited, grey where it ran ahead, hidden behind decode)."""
    import matplotlib  # lazy: pyplot takes about a second to import and only --plot needs it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = timeline_series(stats, t0)
    fig, (ax_rows, ax_rate) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    if len(replicas) > 1:
        for i, report in enumerate(replicas):
            own = timeline_series(report["stats"], t0)
            line, = ax_rows.plot(own.t, own.live, ".", markersize=2, label=f"replica {i} ({report['device']}) live")
            ax_rows.step(own.t, own.bucket, where="post", color=line.get_color(), alpha=0.4, linewidth=1)
    else:
        ax_rows.step(series.t, series.bucket, where="post", label="bucket", color="tab:orange")
        ax_rows.plot(series.t, series.live, ".", markersize=2, label="live rows", color="tab:blue")
    ax_rows.set_ylabel("batch rows")
    ax_rows.legend(loc="upper right")
    ax_rate.plot(series.t + series.span / 2, series.rate, color="tab:green")
    ax_rate.set_ylabel("decode tok/s")
    ax_rate.set_xlabel("time since start (s)")
    for event in stats.compiles:
        color = COMPILE_COLORS.get(event.thread, "tab:purple")
        for ax in (ax_rows, ax_rate):
            ax.axvspan(event.time - t0, event.time - t0 + event.seconds, color=color, alpha=0.25, linewidth=0)
    fig.suptitle("rwkv7-generate run (compiles shaded: red = decode waited, grey = ahead, orange = prefill)")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
