"""Memory over a long job: RSS against requests processed (10k ... 1M) through the scheduler
on the zero-cost CountingEngine (tests/support/scheduler_engines.py ``soak``: at most 512 requests in flight,
every result checked on arrival, as the batch command streams them).

    PYTHONPATH=. python benchmarks/soak_bench.py --label after            # this checkout
    PYTHONPATH=. python benchmarks/soak_bench.py --label main --requests 1000000

Each run adds (or replaces) its label's row in benchmarks/results/soak_rss.json and prints
the table. The "main" row was measured on a copy of main with that branch's
scheduler/testing.py (now tests/support/scheduler_engines.py) dropped in (main's scheduler
had no CountingEngine).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import scheduler as scheduler_module
from scheduler import Scheduler, SchedulerConfig
from tests.support.scheduler_engines import CountingEngine, rss_bytes, soak

RESULTS = Path(__file__).resolve().parent / "results" / "soak_rss.json"
CHECKPOINTS = (10_000, 100_000, 250_000, 500_000, 1_000_000)


def measure(n: int) -> list[dict]:
    scheduler = Scheduler(CountingEngine(), SchedulerConfig(max_batch=256))
    start = time.perf_counter()
    rows = [{"requests": 0, "rss_mb": rss_bytes() / 2**20, "seconds": 0.0}]

    def checkpoint(done: int) -> None:
        gc.collect()
        rows.append({"requests": done, "rss_mb": round(rss_bytes() / 2**20, 1),
                     "seconds": round(time.perf_counter() - start, 1)})
        print(f"{done:>10,} requests  {rows[-1]['rss_mb']:8.1f} MB  {rows[-1]['seconds']:7.1f} s", flush=True)

    finished = soak(scheduler, n, checkpoints=[c for c in CHECKPOINTS if c <= n], on_checkpoint=checkpoint)
    assert (finished == 1).all(), "a request did not finish exactly once"
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True, help="row name, e.g. main or after")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--note", default="", help="where the measured scheduler came from")
    args = ap.parse_args(argv)
    rows = measure(args.requests)
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(scheduler_module.__file__)).stdout.strip()
    except OSError:
        commit = ""
    result[args.label] = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
                          "note": args.note,
                          "python": platform.python_version(), "cpus": os.cpu_count(),
                          "load_average": os.getloadavg(), "checkpoints": rows,
                          "growth_mb_10pct_to_100pct": round(rows[-1]["rss_mb"] - next(
                              (r["rss_mb"] for r in rows if r["requests"] >= args.requests // 10), rows[0]["rss_mb"]), 1)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
