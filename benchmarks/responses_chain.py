"""Multi-turn conversations through the Responses API (``previous_response_id``), on one
replica and on ``--data-parallel`` replicas: per turn, the prompt tokens the server gets
(the whole conversation: the stored turn's tokens + the new message), how many of them were
prefilled rather than served by the turn cache (usage.input_tokens_details.cached_tokens) and
TTFT; at the end
the prefix-cache hits and, on replicas, how many turns conversation affinity kept on their
replica.

    python benchmarks/responses_chain.py                       # tiny-world, 1 and 2 replicas
    python benchmarks/responses_chain.py --smoke               # a few turns, < 1 minute

Each of --conversations conversations is a chain of --turns turns (user messages of random
words, --message-tokens long; replies of at most --reply-tokens, greedy), --concurrency
conversations at a time, each streamed with the official openai client, after a warm-up round (--concurrency
conversations) that is not counted. Replicas run on
forced XLA CPU devices (``--xla_force_host_platform_device_count``). Writes
responses_chain_<tag>.json and .md under --out.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.http_serving import _free_port, start_server  # noqa: E402

RESULTS = Path("benchmarks") / "results"
WORDS = ("river stone light cloud song tree quiet morning paper window garden story road letter "
         "winter summer city friend music color").split()


def _message(rng: np.random.Generator, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS, int(rng.integers(lo, hi + 1))))  # about one token a word


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" ([0-9.e+-]+)"
    match = re.search(r"^" + pattern + r"$", text, re.M)
    return float(match.group(1)) if match else 0.0


async def _conversations(url: str, args, seed: int, conversations: int) -> list[list[dict]]:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=600)
    rng = np.random.default_rng(seed)
    plans = [[_message(rng, *args.message_tokens) for _ in range(args.turns)] for _ in range(conversations)]
    todo = iter(plans)
    turns: list[list[dict]] = []

    async def worker():
        for plan in todo:
            previous, rows = None, []
            for text in plan:
                sent = time.perf_counter()
                first = None
                stream = await client.responses.create(model=args.served, input=text, previous_response_id=previous,
                                                       max_output_tokens=args.reply_tokens, temperature=0, stream=True)
                async for event in stream:
                    if event.type == "response.output_text.delta" and first is None:
                        first = time.perf_counter()
                    if event.type in ("response.completed", "response.incomplete"):
                        done = event.response
                rows.append({"input_tokens": done.usage.input_tokens, "output_tokens": done.usage.output_tokens,
                             "cached_tokens": done.usage.input_tokens_details.cached_tokens,
                             "ttft_s": (first or time.perf_counter()) - sent})
                previous = done.id
            turns.append(rows)

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    await client.close()
    return turns


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
        return r.read().decode()


def run_level(args, replicas: int) -> dict:
    """One server of ``replicas`` replicas: a warm-up round (not counted), then the measured one."""
    port = _free_port()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={max(replicas, 1)}"
    server_args = argparse.Namespace(**{**vars(args), "prompt_len": (1, args.max_prompt_tokens)})
    proc = start_server(server_args, port, extra=["--data-parallel", str(replicas), "--served-model-name",
                                                  args.served, "--prefix-cache-mb", str(args.prefix_cache_mb)])
    try:
        url = f"http://127.0.0.1:{port}/v1"
        asyncio.run(_conversations(url, args, args.seed + 1, args.concurrency))  # compiles what is left
        before = _scrape(port)
        start = time.perf_counter()
        turns = asyncio.run(_conversations(url, args, args.seed, args.conversations))
        wall = time.perf_counter() - start
        after = _scrape(port)
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    def count(name: str, labels: str = "") -> float:
        return _metric(after, name, labels) - _metric(before, name, labels)

    per_turn = []
    for k in range(args.turns):
        rows = [c[k] for c in turns]
        per_turn.append({"turn": k + 1, "input_tokens_mean": float(np.mean([r["input_tokens"] for r in rows])),
                         "prefilled_tokens_mean": float(np.mean([r["input_tokens"] - r["cached_tokens"] for r in rows])),
                         "ttft_ms_p50": float(np.percentile([r["ttft_s"] for r in rows], 50)) * 1e3})
    hits = count("rwkv7_prefix_cache_lookups_total", 'result="hit"')
    misses = count("rwkv7_prefix_cache_lookups_total", 'result="miss"')
    out = {"replicas": replicas, "wall_s": wall, "per_turn": per_turn,
           "prefix_cache_hit_rate": hits / (hits + misses) if hits + misses else None}
    if replicas > 1:
        kept = count("rwkv7_affinity_routes_total", 'result="kept"')
        moved = count("rwkv7_affinity_routes_total", 'result="moved"')
        out.update(affinity_kept=kept, affinity_moved=moved,
                   continuation_turns=args.conversations * (args.turns - 1),
                   routed=[count("rwkv7_replica_routed_total", f'replica="{i}"') for i in range(replicas)])
    return out


def markdown(results: dict) -> str:
    a = results["args"]
    lines = [f"# Responses API conversations ({results['tag']})", "",
             f"{a['conversations']} conversations x {a['turns']} turns, concurrency {a['concurrency']}, model "
             f"{a['model']} ({a['backend']}), prefix cache {a['prefix_cache_mb']:g} MB, messages {a['message_tokens']} words, replies <= {a['reply_tokens']} "
             f"tokens, on {results['environment']['machine']}.", ""]
    for level in results["levels"]:
        lines += [f"## {level['replicas']} replica(s): wall {level['wall_s']:.1f} s, prefix-cache hit rate "
                  f"{level['prefix_cache_hit_rate']}", ""]
        if "affinity_kept" in level:
            lines += [f"Affinity: {level['affinity_kept']:.0f} of {level['continuation_turns']} continuation turns "
                      f"kept on their replica, {level['affinity_moved']:.0f} moved; routed per replica "
                      f"{level['routed']}.", ""]
        lines += ["| turn | prompt tokens (mean) | prefilled (not from the cache) | TTFT p50 ms |", "|---|---|---|---|"]
        lines += [f"| {t['turn']} | {t['input_tokens_mean']:.0f} | {t['prefilled_tokens_mean']:.0f} | "
                  f"{t['ttft_ms_p50']:.1f} |" for t in level["per_turn"]]
        lines.append("")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-world", help="random model shape (a -world one)")
    p.add_argument("--backend", default="jax", choices=("jax", "torch"))
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--message-tokens", type=int, nargs=2, default=(20, 200), metavar=("LO", "HI"))
    p.add_argument("--reply-tokens", type=int, default=64)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--prefix-cache-mb", type=float, default=64.0, help="the server's prefix cache")
    p.add_argument("--max-prompt-tokens", type=int, default=1 << 16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout", type=float, default=900)
    p.add_argument("--smoke", action="store_true", help="4 conversations x 3 turns")
    p.add_argument("--tag", default="cpu_tiny")
    p.add_argument("--out", default=str(RESULTS))
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    args.served = "bench"
    if args.smoke:
        args.conversations, args.turns, args.reply_tokens, args.tag = 4, 3, 16, args.tag + "_smoke"
    levels = [run_level(args, n) for n in args.replicas]
    results = {"tag": args.tag, "args": {k: v for k, v in vars(args).items() if k != "out"},
               "environment": {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}, "levels": levels}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"responses_chain_{args.tag}.json").write_text(json.dumps(results, indent=1))
    (out / f"responses_chain_{args.tag}.md").write_text(markdown(results))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
