"""Compiling ahead (scheduler/ahead.py): does a bucket switch still wait for a compile?

Runs the batch command (``python -m scheduler``, a subprocess per run) on the random
``tiny-world`` model, for this tree and, with ``--base DIR`` (a checkout of the commit
before, e.g. ``git archive BASE | tar -x -C DIR``), for that one, interleaved:

- the demo (``make demo``: rwkv7_apps/data/example_prompts.jsonl, ``--max-tokens 32``)
  cold (a fresh, empty JAX_COMPILATION_CACHE_DIR per tree) and then warm (the same cache);
- a prompt-heavy job of ``--requests`` lines (generated here: 32-160 random prompt tokens,
  4-24 output tokens each), after the demos (their cache: warm for the shared shapes, cold
  for the buckets the demo never used).

Per run: wall time, buckets used, every bucket switch with the decode thread's wait at it
(resize + compiles waited for; for the base, which books no threads, the compiles of the
target bucket's executables just before the switch), compile seconds on the critical path
(the decode thread waited) and hidden (compiled ahead), steps kept in a bucket while another
compiled, inter-token p50/p99, TTFT p50, and whether the output tokens equal the base's.
Saves benchmarks/results/compile_ahead.{json,md}.

    python benchmarks/compile_ahead.py --base /tmp/base [--requests 2000]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEMO_INPUT = "rwkv7_apps/data/example_prompts.jsonl"
DECODE_KINDS = ("step", "empty", "insert", "extract", "gather", "bucket", "step_logprobs", "mixed")
"""Executables only the decode thread runs: in the base every compile of them was waited for."""
SWITCH_BUDGET_S = 0.015


def write_job(path: Path, n: int, seed: int = 0) -> None:
    """``n`` prompt-heavy lines: 32-160 random World-vocabulary prompt tokens, 4-24 output tokens."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            tokens = rng.integers(1, 65536, int(rng.integers(32, 161))).tolist()
            f.write(json.dumps({"id": f"j{i}", "tokens": tokens, "max_tokens": int(rng.integers(4, 25))}) + "\n")


def run(tree: Path, name: str, inp: str, out_dir: Path, cache: Path, max_tokens: int | None) -> dict:
    """One batch run of ``tree``'s code; its metrics, outputs ({id: tokens}) and switch waits."""
    out, metrics = out_dir / f"{name}.jsonl", out_dir / f"{name}_metrics.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "scheduler", "--random-model", "tiny-world", "--input", inp,
           "--output", str(out), "--metrics", str(metrics), "--plot", str(out_dir / f"{name}.png")]
    if max_tokens is not None:
        cmd += ["--max-tokens", str(max_tokens)]
    env = dict(os.environ, PYTHONPATH=str(tree), JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache))
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    m = json.loads(metrics.read_text())
    tokens = {}
    for line in out.read_text().splitlines():
        record = json.loads(line)
        tokens[record["id"]] = record["tokens"]
    return {"name": name, "process_seconds": seconds, "metrics": m, "tokens": tokens, "load": os.getloadavg()[0]}


def _to_bucket(what: str, bucket: int) -> bool:
    """Whether an executable named ``what`` ("step:8", "gather:(32, 8)", "bucket 8") serves bucket ``bucket``."""
    return bool(re.search(rf"[:( ]{bucket}\)?$", what.removesuffix(" first run")))


def summarize(result: dict) -> dict:
    m = result["metrics"]
    events = m["compile_events"]
    decode_kind = [e for e in events if re.split(r"[: ]", e["what"], maxsplit=1)[0] in DECODE_KINDS]
    if "compile_seconds_waited" in m:
        waited, hidden = m["compile_seconds_waited"], m["compile_seconds_hidden"]
        waits = [s["seconds"] + s["compile_wait"] for s in m["bucket_switches"]]
    else:  # the base compiled every decode executable on the decode thread, just before its switch
        waited, hidden = sum(e["seconds"] for e in decode_kind), 0.0
        waits, last = [], -1.0
        for s in m["bucket_switches"]:
            waits.append(s["seconds"] + sum(e["seconds"] for e in decode_kind
                                            if last < e["time"] <= s["time"] and _to_bucket(e["what"], s["to_bucket"])))
            last = s["time"]
    switches = [{"from": s["from_bucket"], "to": s["to_bucket"], "live": s["live"], "t": round(s["time"], 3),
                 "wait_ms": round(1e3 * w, 3)} for s, w in zip(m["bucket_switches"], waits)]
    itl = m["inter_token_latency_s"]
    return {
        "name": result["name"], "load_avg_1m": round(result["load"], 1),
        "wall_time_s": round(m["wall_time_s"], 2), "process_s": round(result["process_seconds"], 2),
        "buckets_used": sorted({e["bucket"] for e in m["bucket_timeline"]}),
        "switches": len(switches), "switch_wait_max_ms": max((s["wait_ms"] for s in switches), default=None),
        "switch_wait_max_ms_decoding": max((s["wait_ms"] for s in switches if s["from"]), default=None),
        "switches_over_15ms": sum(s["wait_ms"] > 1e3 * SWITCH_BUDGET_S for s in switches),
        "compile_s_total": round(m["compile_seconds"], 2), "compile_s_critical": round(waited, 2),
        "compile_s_hidden": round(hidden, 2), "kept_steps": m.get("kept_steps"),
        "itl_p50_ms": round(1e3 * itl["p50"], 1), "itl_p99_ms": round(1e3 * itl["p99"], 1),
        "itl_p99_over_p50": round(itl["p99"] / itl["p50"], 2), "ttft_p50_ms": round(1e3 * m["ttft_s"]["p50"], 1),
        "decode_tok_s": m["decode_tok_s"]["average"], "decode_steps": m["decode_steps"],
        "switch_list": switches,
    }


def same_tokens(a: dict, b: dict) -> dict:
    """How many ids have equal tokens in both runs."""
    ids = set(a) & set(b)
    equal = sum(a[i] == b[i] for i in ids)
    return {"ids": len(ids), "equal": equal, "all_equal": equal == len(ids) == len(a) == len(b)}


def table(rows: list[dict]) -> str:
    cols = ["name", "load_avg_1m", "wall_time_s", "buckets_used", "switches", "switch_wait_max_ms_decoding",
            "switch_wait_max_ms", "switches_over_15ms", "compile_s_critical", "compile_s_hidden", "kept_steps",
            "itl_p50_ms", "itl_p99_ms", "itl_p99_over_p50", "ttft_p50_ms"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", type=Path, help="a checkout of the commit to compare with")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--phases", default="demo_cold,demo_warm,job",
                   help="which runs, in order (the job alone runs on a cold cache)")
    p.add_argument("--out", default="compile_ahead", help="results file name (without .json / .md)")
    args = p.parse_args(argv)
    trees = {"this": ROOT} if args.base is None else {"base": args.base.resolve(), "this": ROOT}
    work = Path(tempfile.mkdtemp(prefix="compile_ahead_"))
    job = work / "job.jsonl"
    write_job(job, args.requests)
    caches = {k: work / f"cache_{k}" for k in trees}
    results: dict[str, dict] = {}
    for phase in args.phases.split(","):
        for key, tree in trees.items():  # interleaved: base then this, phase by phase
            name = f"{phase}_{key}"
            inp, max_tokens = (str(job), None) if phase == "job" else (DEMO_INPUT, 32)
            print(f"running {name} ...", flush=True)
            results[name] = run(tree, name, inp, work, caches[key], max_tokens)
            print(json.dumps({k: v for k, v in summarize(results[name]).items() if k != "switch_list"}), flush=True)
    rows = [summarize(r) for r in results.values()]
    same = {}
    if "base" in trees:
        for phase in ("demo_cold", "demo_warm", "job"):
            if f"{phase}_base" in results:
                same[phase] = same_tokens(results[f"{phase}_base"]["tokens"], results[f"{phase}_this"]["tokens"])
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
           "base": None if args.base is None else (args.base / "BASE_COMMIT").read_text().strip()
           if (args.base / "BASE_COMMIT").exists() else str(args.base),
           "requests": args.requests, "runs": rows, "same_tokens_as_base": same,
           "note": "a loaded 2-core machine shared with other jobs (load_avg_1m per run): absolute times are "
                   "noisy; compare base and this run by run"}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1) + "\n")
    md = [f"# Compile ahead: bucket switches and compile time on the critical path ({out['date']})", "",
          f"tiny-world random model, XLA:CPU, {out['cpus']} CPUs, **loaded machine** (load average per run in the "
          f"table); base = {out['base']}, this = the compile-ahead branch. `benchmarks/compile_ahead.py`.", "",
          table(rows), "", f"Output tokens equal to the base's: {json.dumps(same)}", ""]
    for r in rows:
        md.append(f"- {r['name']} switches: " + ", ".join(f"{s['from']}->{s['to']} ({s['live']} live) "
                                                      f"{s['wait_ms']} ms" for s in r["switch_list"][:40]))
    (RESULTS / f"{args.out}.md").write_text("\n".join(md) + "\n")
    print(table(rows))
    print("same tokens:", same)
    return out


if __name__ == "__main__":
    main()
