"""HTTP serving benchmark: rwkv7-serve under fixed client concurrencies, against the same
workload run in-process through the scheduler (the HTTP layer's own cost).

    python benchmarks/http_serving.py                      # tiny model, concurrency 1, 8, 32, 128
    python benchmarks/http_serving.py --model 0.1b --requests 128 --tag cpu_0.1b
    python benchmarks/http_serving.py --smoke              # a few requests, < 1 minute
    python benchmarks/http_serving.py --cold-start --concurrency 1,8 --max-batch 16 --output-len 8 32

The workload (``rwkv7_apps.tools.serving_bench.make_workload``): seeded greedy requests, token-id
prompts of log-uniform length in --prompt-len, output lengths uniform in --output-len (no
stop token, so every request runs its full length). For each concurrency C, max(--requests,
C) requests are sent by C clients that each send their next request when the previous one
ends (vLLM's ``--max-concurrency`` style), streamed, with the official openai client.

1. HTTP: a real ``rwkv7-serve`` subprocess (it precompiles by default, so nothing compiles
   while measured; one warm-up round first). Per request: TTFT (send -> first token chunk),
   inter-token gaps (between token chunks), end-to-end latency.
2. In-process: the same engine and scheduler options in this process, the same requests
   at the same concurrency, fed to ``Scheduler.run`` by its callbacks; TTFT from ``add``.

Per concurrency: request throughput (req/s), output tok/s, TTFT / ITL / latency p50 and p99,
and CPU milliseconds per output token (HTTP: the server process and the client separately;
in-process: this process), for both; the overhead of HTTP is the difference in mean
latency per request and the ratio of output rates. Writes http_serving_<tag>.json and .md under --out.

``--cold-start``: compile stalls instead. For the default server and one started with
``--no-precompile``, each from a fresh, empty compilation cache: the seconds until /health
says ready, then the same workloads twice with no warm-up (pass 1 straight after ready,
pass 2 after it), TTFT p99 of each pass and their ratio, and /metrics' compile count at
ready and after each pass. Writes http_serving_cold_<tag>.json and .md.
``gpu_check_section(out_dir, budget_s)`` is the short run benchmarks/gpu_check.py calls.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from rwkv7_apps.tools.serving_bench import make_workload

RESULTS = Path("benchmarks") / "results"


def _pct(values, q):
    return float(np.percentile(values, q)) if len(values) else None


def summarize(records: list[dict], wall_s: float) -> dict:
    """records: {ttft, gaps, latency, tokens} per request."""
    tokens = sum(r["tokens"] for r in records)
    gaps = [g for r in records for g in r["gaps"]]
    ttft = [r["ttft"] for r in records if r["ttft"] is not None]
    latency = [r["latency"] for r in records]
    return {"requests": len(records), "wall_s": wall_s, "request_throughput": len(records) / wall_s,
            "output_tok_s": tokens / wall_s, "output_tokens": tokens,
            "ttft_ms": {"p50": _pct(ttft, 50) * 1e3, "p99": _pct(ttft, 99) * 1e3, "mean": float(np.mean(ttft)) * 1e3},
            "itl_ms": {"p50": (_pct(gaps, 50) or 0) * 1e3, "p99": (_pct(gaps, 99) or 0) * 1e3},
            "latency_ms": {"p50": _pct(latency, 50) * 1e3, "p99": _pct(latency, 99) * 1e3,
                           "mean": float(np.mean(latency)) * 1e3}}


# ----------------------------------------------------------------------------- HTTP side
def start_server(args, port: int, extra=(), env: dict | None = None) -> subprocess.Popen:
    """A healthy rwkv7-serve subprocess of ``args``' model and options, plus ``extra`` options
    (a sequence of strings) and ``env`` variables."""
    cmd = [sys.executable, "-m", "rwkv7_apps.serve", "--random-model", args.model, "--port", str(port),
           "--backend", args.backend, "--max-batch", str(args.max_batch), *extra,
           "--max-waiting", "100000", "--max-prompt-tokens", str(args.prompt_len[1])]
    root = str(Path(__file__).resolve().parents[1])  # the server runs this checkout's packages
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    log = tempfile.TemporaryFile()  # never a pipe nobody drains
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    import urllib.request
    deadline = time.monotonic() + args.startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"server exited: {log.read()[-2000:].decode(errors='replace')}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not become healthy")


async def http_level(url: str, model: str, requests, concurrency: int) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=600)
    todo = iter(requests)
    records = []

    async def worker():
        for r in todo:
            sent = time.perf_counter()
            arrivals = []
            stream = await client.completions.create(
                model=model, prompt=list(r.prompt_tokens), max_tokens=r.params.max_tokens, temperature=0,
                stream=True, extra_body={"stop_token_ids": [], "return_token_ids": True})
            async for chunk in stream:
                if chunk.choices:
                    n = len(chunk.choices[0].model_extra.get("token_ids") or [])
                    arrivals += [time.perf_counter()] * n
            done = time.perf_counter()
            records.append({"ttft": arrivals[0] - sent if arrivals else None, "gaps": list(np.diff(arrivals)),
                            "latency": done - sent, "tokens": len(arrivals)})

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await client.close()
    return summarize(records, wall)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def run_http_levels(args, workloads: dict[int, list]) -> dict:
    port = _free_port()
    proc = start_server(args, port)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        warm = workloads[max(workloads)][:max(workloads)]
        asyncio.run(http_level(url, f"random-{args.model}", warm, max(workloads)))
        out = {}
        for c, reqs in workloads.items():
            server0, client0 = process_cpu_s(proc.pid), time.process_time()
            out[c] = asyncio.run(http_level(url, f"random-{args.model}", reqs, c))
            server1, tokens = process_cpu_s(proc.pid), out[c]["output_tokens"]
            out[c]["cpu_ms_per_token"] = {
                "server": None if server0 is None else (server1 - server0) / tokens * 1e3,
                "client": (time.process_time() - client0) / tokens * 1e3}
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def compiles_so_far(port: int) -> int:
    """The server's compile count (the sum of /metrics' rwkv7_compiles_total)."""
    import re
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return int(sum(float(v) for v in re.findall(r"^rwkv7_compiles_total\{[^}]*\} (\S+)$", text, re.M)))


def run_cold(args) -> dict:
    """``--cold-start`` (module docstring): per server mode, ready seconds and two passes."""
    levels = sorted(set(args.concurrency))
    workloads = {c: make_workload(max(args.requests, c), tuple(args.prompt_len), tuple(args.output_len),
                                  _vocab(args.model), seed=c) for c in levels}
    modes = {}
    for mode, extra in (("precompile (default)", ()), ("--no-precompile", ("--no-precompile",))):
        with tempfile.TemporaryDirectory() as cache:
            port, start = _free_port(), time.perf_counter()
            proc = start_server(args, port, extra, env={"JAX_COMPILATION_CACHE_DIR": cache})
            ready_s, compiles = time.perf_counter() - start, [compiles_so_far(port)]
            url, passes = f"http://127.0.0.1:{port}/v1", []
            try:
                for _ in range(2):
                    passes.append({c: asyncio.run(http_level(url, f"random-{args.model}", reqs, c))
                                   for c, reqs in workloads.items()})
                    compiles.append(compiles_so_far(port))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        modes[mode] = {"ready_s": ready_s, "compiles": compiles, "passes": passes,
                       "ttft_p99_ratio": {c: passes[0][c]["ttft_ms"]["p99"] / passes[1][c]["ttft_ms"]["p99"]
                                          for c in levels}}
    return modes


def cold_markdown(results: dict) -> str:
    a = results["args"]
    lines = [f"# Cold start: compile stalls ({results['tag']})", "",
             f"Model `{a['model']}` ({a['backend']}), max_batch {a['max_batch']}, {a['requests']} requests a level, "
             f"prompts {a['prompt_len']} tokens, outputs {a['output_len']}, streamed; each server from an empty "
             f"compilation cache, no warm-up; {results['environment']['machine']}.", "",
             "| server | ready after s | compiles at ready / after pass 1 / after pass 2 | C "
             "| TTFT p99 pass 1 / pass 2 ms | ratio |", "|---|---|---|---|---|---|"]
    for mode, m in results["cold"].items():
        for c, ratio in m["ttft_p99_ratio"].items():
            p1, p2 = (m["passes"][i][c]["ttft_ms"]["p99"] for i in (0, 1))
            lines.append(f"| {mode} | {m['ready_s']:.0f} | {' / '.join(map(str, m['compiles']))} | {c} "
                         f"| {p1:.0f} / {p2:.0f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- in-process side
def inprocess_level(sched, requests, concurrency: int) -> dict:
    """The same requests fed to Scheduler.run, at most ``concurrency`` in flight."""
    from scheduler import Request

    todo = iter(requests)
    sent, arrivals, records = {}, {}, []
    tag = f"c{concurrency}-{time.perf_counter_ns()}-"

    def add_next():
        r = next(todo, None)
        if r is not None:
            rid = tag + r.id
            sent[rid], arrivals[rid] = time.perf_counter(), []
            sched.add(Request(rid, r.prompt_tokens, r.params))

    def on_token(rid, token):
        arrivals[rid].append(time.perf_counter())

    def on_finish(out):
        done = time.perf_counter()
        a = arrivals.pop(out.id)
        records.append({"ttft": a[0] - sent[out.id] if a else None, "gaps": list(np.diff(a)),
                        "latency": done - sent.pop(out.id), "tokens": len(a)})
        add_next()

    start = time.perf_counter()
    for _ in range(concurrency):
        add_next()
    sched.run(on_token=on_token, on_finish=on_finish)
    return summarize(records, time.perf_counter() - start)


def run_inprocess_levels(args, workloads: dict[int, list]) -> dict:
    from rwkv7_apps.engines import load_engine, random_model_path
    from scheduler import Scheduler, SchedulerConfig

    engine = load_engine(args.backend, random_model_path(args.model))
    config = SchedulerConfig(max_batch=args.max_batch, precompile=True)
    engine.compile_prefill()
    sched = Scheduler(engine, config)
    inprocess_level(sched, workloads[max(workloads)][:max(workloads)], max(workloads))  # warm-up
    out = {}
    for c, reqs in workloads.items():
        cpu0 = time.process_time()
        out[c] = inprocess_level(sched, reqs, c)
        out[c]["cpu_ms_per_token"] = {"process": (time.process_time() - cpu0) / out[c]["output_tokens"] * 1e3}
    return out


# ----------------------------------------------------------------------------- report
def overhead(http: dict, local: dict) -> dict:
    return {c: {"latency_mean_ms_added": http[c]["latency_ms"]["mean"] - local[c]["latency_ms"]["mean"],
                "ttft_mean_ms_added": http[c]["ttft_ms"]["mean"] - local[c]["ttft_ms"]["mean"],
                "output_tok_s_ratio": http[c]["output_tok_s"] / local[c]["output_tok_s"]}
            for c in http}


def markdown(results: dict) -> str:
    a = results["args"]
    lines = [f"# HTTP serving benchmark ({results['tag']})", "",
             f"Model `{a['model']}` ({a['backend']}), max_batch {a['max_batch']}, prompts {a['prompt_len']} tokens "
             f"(log-uniform), outputs {a['output_len']} tokens (uniform), greedy, streamed; "
             f"{results['environment']['machine']}.", "",
             "| C | side | req/s | out tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | latency p50 / p99 ms "
             "| CPU ms / token |", "|---|---|---|---|---|---|---|---|"]
    for c in results["http"]:
        for side in ("http", "inprocess"):
            r = results[side][c]
            lines.append(f"| {c} | {side} | {r['request_throughput']:.2f} | {r['output_tok_s']:.0f} | "
                         f"{r['ttft_ms']['p50']:.1f} / {r['ttft_ms']['p99']:.1f} | "
                         f"{r['itl_ms']['p50']:.2f} / {r['itl_ms']['p99']:.2f} | "
                         f"{r['latency_ms']['p50']:.0f} / {r['latency_ms']['p99']:.0f} | {_cpu(r)} |")
    lines += ["", "HTTP layer overhead (HTTP minus in-process `Scheduler.run`, same requests, same concurrency):", "",
              "| C | mean latency added ms | mean TTFT added ms | output tok/s ratio |", "|---|---|---|---|"]
    for c, o in results["overhead"].items():
        lines.append(f"| {c} | {o['latency_mean_ms_added']:.1f} | {o['ttft_mean_ms_added']:.1f} | "
                     f"{o['output_tok_s_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def _cpu(row: dict) -> str:
    cpu = row["cpu_ms_per_token"]
    if "process" in cpu:
        return f"{cpu['process']:.2f}"
    server = "?" if cpu["server"] is None else f"{cpu['server']:.2f}"
    return f"server {server} + client {cpu['client']:.2f}"


def _environment() -> dict:
    import jax
    return {"machine": f"{platform.machine()} {os.cpu_count()} CPUs, jax {jax.__version__} "
                       f"({jax.default_backend()}), load average {os.getloadavg()[0]:.1f} at the end",
            "python": platform.python_version()}


def run(args) -> dict:
    levels = sorted(set(args.concurrency))
    workloads = {c: make_workload(max(args.requests, c), tuple(args.prompt_len), tuple(args.output_len),
                                  _vocab(args.model), seed=c) for c in levels}
    http = run_http_levels(args, workloads)
    local = run_inprocess_levels(args, workloads)
    results = {"tag": args.tag, "args": {k: v for k, v in vars(args).items() if k != "out"},
               "environment": _environment(), "http": http, "inprocess": local, "overhead": overhead(http, local)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"http_serving_{args.tag}.json").write_text(json.dumps(results, indent=1))
    (out / f"http_serving_{args.tag}.md").write_text(markdown(results))
    return results


def _vocab(model: str) -> int:
    from rwkv7_apps.engines import random_model_config
    return random_model_config(model).vocab_size


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", help="random model shape (rwkv7_apps.engines names)")
    p.add_argument("--backend", default="jax", choices=("jax", "torch"))
    p.add_argument("--max-batch", type=int, default=128)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 128])
    p.add_argument("--requests", type=int, default=64, help="requests per level (at least the concurrency)")
    p.add_argument("--prompt-len", type=int, nargs=2, default=[8, 256])
    p.add_argument("--output-len", type=int, nargs=2, default=[16, 64])
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--tag", default="cpu_tiny")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--smoke", action="store_true", help="concurrency 1,4; 8 requests; short outputs")
    p.add_argument("--cold-start", action="store_true",
                   help="compile stalls: two passes from an empty compilation cache, with and without precompile")
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    if args.smoke:
        args.concurrency, args.requests, args.max_batch = [1, 4], 8, 4
        args.prompt_len, args.output_len = [4, 32], [4, 8]
        args.tag = args.tag if args.tag != "cpu_tiny" else "smoke"
    if args.cold_start:
        results = {"tag": args.tag, "args": {k: v for k, v in vars(args).items() if k != "out"},
                   "cold": run_cold(args), "environment": _environment()}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"http_serving_cold_{args.tag}.json").write_text(json.dumps(results, indent=1))
        (out / f"http_serving_cold_{args.tag}.md").write_text(cold_markdown(results))
        print(cold_markdown(results))
        return results
    results = run(args)
    print(markdown(results))
    return results


def gpu_check_section(out_dir: str, budget_s: float) -> dict:
    """The CPU run's workload (tiny model, concurrency 1, 8, 32, 128, 64 requests each) on
    the GPU: well under two minutes; ``budget_s`` bounds the server's start-up."""
    args = parser().parse_args(["--tag", "gpu_tiny", "--out", out_dir, "--startup-timeout", str(max(60.0, budget_s))])
    results = run(args)
    return {"http": results["http"], "overhead": results["overhead"]}


if __name__ == "__main__":
    main()
