"""Resume at scale: rerun a 1M-line job whose output already holds 900k results.

Builds IN (1,000,000 lines of 1-8 prompt tokens) and OUT (the first 900,000 results), then
runs ``rwkv7-generate`` in-process on the zero-cost CountingEngine (the model would only add
its own load and compile time) and reports: seconds from the start of ``main`` to the first
decode step, RSS before/at the first step/at the end, and the total time for the 100k
remaining requests. Saves benchmarks/results/resume_bench.json.

    python benchmarks/resume_bench.py [--lines 1000000 --done 900000]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import rwkv7_apps.generate.cli as cli
from tests.support.scheduler_engines import CountingEngine, rss_bytes

RESULTS = Path(__file__).resolve().parent / "results" / "resume_bench.json"


def write_files(tmp: Path, lines: int, done: int) -> tuple[Path, Path]:
    inp, out = tmp / "in.jsonl", tmp / "out.jsonl"
    with open(inp, "w") as f:
        for i in range(lines):
            f.write(json.dumps({"id": f"req-{i}", "tokens": [1 + (i + k) % 60 for k in range(1 + i % 8)],
                                "max_tokens": 1 + i % 8}) + "\n")
    with open(out, "w") as f:
        for i in range(done):
            n = 1 + i % 8
            f.write(json.dumps({"id": f"req-{i}", "tokens": list(range(1, n + 1)), "finish_reason": "length",
                                "prompt_tokens": 1 + i % 8, "generated_tokens": n}) + "\n")
    return inp, out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--done", type=int, default=900_000)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        inp, out = write_files(tmp, args.lines, args.done)
        ckpt = tmp / "model.pth"
        ckpt.write_bytes(b"")
        seen = {}

        class Timed(CountingEngine):
            def step(self, tokens, positions):
                if "first_step" not in seen:
                    seen["first_step"] = time.perf_counter()
                    seen["rss_first_step_mb"] = rss_bytes() / 2**20
                return super().step(tokens, positions)

        cli.load_engine = lambda *a, **k: Timed()
        os.environ["TQDM_DISABLE"] = "1"
        rss0 = rss_bytes() / 2**20
        start = time.perf_counter()
        assert cli.main(["--model", str(ckpt), "--input", str(inp), "--output", str(out), "--max-batch", "256"]) == 0
        end = time.perf_counter()
        with open(out) as f:
            total = sum(1 for _ in f)
    result = {"lines": args.lines, "already_done": args.done, "results_after": total,
              "seconds_to_first_decode_step": round(seen["first_step"] - start, 2),
              "seconds_total": round(end - start, 2), "rss_before_mb": round(rss0, 1),
              "rss_at_first_step_mb": round(seen["rss_first_step_mb"], 1),
              "rss_end_mb": round(rss_bytes() / 2**20, 1), "load_average": os.getloadavg()}
    assert total == args.lines, f"{total} results for {args.lines} lines"
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
