"""Multi-turn chat benchmark: a real rwkv7-serve driven over HTTP chat completions, the turn
cache on (``--prefix-cache-mb``) against off, on the same seeded conversations.

    python benchmarks/multi_turn.py                          # tiny-world: 32 conversations x 8 turns
    python benchmarks/multi_turn.py --model 0.1b --conversations 8 --tag cpu_0.1b
    python benchmarks/multi_turn.py --smoke                  # 2 x 3, short messages, < 1 minute

The workload: --conversations conversations of --turns turns, --concurrency clients each
running one conversation at a time (a conversation's turns in order, each turn sending the
whole history back: the messages so far, the server's replies as it sent them). User
messages are random English-like words, --user-tokens tokens (uniform); replies are greedy,
at most --reply-tokens tokens (random weights: most run their full length).

Per turn index (1..T), over the conversations: prompt tokens, prefill tokens computed
(prompt minus ``usage.prompt_tokens_details.cached_tokens``), new tokens (the prompt minus
the previous turn's prompt and the reply ids it carries: what a perfect cache leaves to
prefill), TTFT (request sent -> first token chunk, streamed). Summary per side: the turn-T
/ turn-1 mean TTFT ratio, over all conversations and over the steady state (the conversations
after the first --concurrency: the first ones start together, so their turn 1 meets no
decoding batch and the others' does), the prefix-cache hit rate (server /metrics) and the
share of turns after the first that hit; and whether every reply is identical with and
without the cache.
Writes multi_turn_<tag>.json and .md under --out.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import platform
import re
import sys
import time
import urllib.request
from pathlib import Path

if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.http_serving import _free_port, start_server
from rwkv7_apps.serve.chat import reply_ids
from rwkv7_core.tokenizer import WorldTokenizer

RESULTS = Path("benchmarks") / "results"


def word_tokens(tok: WorldTokenizer) -> list[str]:
    """Vocabulary entries that are one lower-case word after a space (' house')."""
    words = []
    for i in range(1, 65536):
        text = tok.decode_bytes([i]).decode("utf-8", errors="replace")
        if re.fullmatch(r" [a-z]{3,9}", text):
            words.append(text)
    return words


def make_conversations(tok, n: int, turns: int, user_tokens: tuple[int, int], seed: int) -> list[list[str]]:
    """n conversations of ``turns`` user messages, each about a uniform draw from user_tokens
    tokens long (cut to exactly that many when encoded alone)."""
    rng = np.random.default_rng(seed)
    words = word_tokens(tok)
    out = []
    for _ in range(n):
        messages = []
        for _ in range(turns):
            target = int(rng.integers(user_tokens[0], user_tokens[1] + 1))
            text = "".join(words[i] for i in rng.integers(0, len(words), target)).strip()
            messages.append(text[0].upper() + text[1:] + "?")
        out.append(messages)
    return out


async def run_conversations(url: str, model: str, conversations, concurrency: int, reply_tokens: int,
                            tok: WorldTokenizer) -> list[list[dict]]:
    """Each conversation's turns: {prompt_tokens, cached_tokens, completion_tokens, reply_ids,
    content, finish_reason, ttft}."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=1200)
    todo = iter(enumerate(conversations))
    results: list[list[dict] | None] = [None] * len(conversations)

    async def one_turn(messages) -> dict:
        sent, first, content, ids, usage, finish = time.perf_counter(), None, "", [], None, None
        stream = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=reply_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"return_token_ids": True})
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                new = c.model_extra.get("token_ids") or []
                if new and first is None:
                    first = time.perf_counter()
                ids += new
                content += c.delta.content or ""
                finish = c.finish_reason or finish
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        kept = reply_ids(tok, ids, content, stopped=tok.decode(ids) != content)
        return {"prompt_tokens": usage.prompt_tokens, "cached_tokens": cached or 0,
                "completion_tokens": usage.completion_tokens, "reply_ids": len(ids) if kept is None else len(kept),
                "content": content, "finish_reason": finish, "ttft": None if first is None else first - sent}

    async def worker():
        for index, user_messages in todo:
            messages, turns = [{"role": "system", "content": "You are a helpful assistant."}], []
            for text in user_messages:
                messages.append({"role": "user", "content": text})
                turn = await one_turn(messages)
                messages.append({"role": "assistant", "content": turn["content"]})
                turns.append(turn)
            results[index] = turns

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return results


def metrics_sample(port: int, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" ([0-9.e+-]+)"
    match = re.search(r"^" + pattern + r"$", text, re.M)
    return float(match.group(1)) if match else 0.0


def per_turn(results: list[list[dict]]) -> list[dict]:
    """Means over the conversations, per turn index."""
    rows = []
    for k in range(len(results[0])):
        turns = [conv[k] for conv in results]
        new = [t["prompt_tokens"] - (conv[k - 1]["prompt_tokens"] + conv[k - 1]["reply_ids"] if k else 0)
               for conv, t in zip(results, turns)]
        ttft = [t["ttft"] for t in turns if t["ttft"] is not None]
        rows.append({"turn": k + 1, "prompt_tokens": float(np.mean([t["prompt_tokens"] for t in turns])),
                     "computed_tokens": float(np.mean([t["prompt_tokens"] - t["cached_tokens"] for t in turns])),
                     "new_tokens": float(np.mean(new)),
                     "hit_share": float(np.mean([t["cached_tokens"] > 0 for t in turns])),
                     "ttft_ms_mean": float(np.mean(ttft)) * 1e3 if ttft else None,
                     "ttft_ms_p50": float(np.median(ttft)) * 1e3 if ttft else None})
    return rows


def run_side(args, conversations, tok, cache_mb: float) -> dict:
    args.prompt_len = (0, 1 << 20)  # start_server's --max-prompt-tokens
    port = _free_port()
    server_args = argparse.Namespace(**{**vars(args), "model": args.model})
    proc = start_server(server_args, port, extra=["--prefix-cache-mb", str(cache_mb), "--max-tokens",
                                                  str(args.reply_tokens)])
    url = f"http://127.0.0.1:{port}/v1"
    try:
        warm = [[m[:40] for m in conversations[0][:2]]]  # compiles nothing measured: a short warm-up chat
        asyncio.run(run_conversations(url, f"random-{args.model}", warm, 1, 4, tok))
        hits0, misses0 = (metrics_sample(port, "rwkv7_prefix_cache_lookups_total", f'result="{r}"')
                          for r in ("hit", "miss"))
        start = time.perf_counter()
        results = asyncio.run(run_conversations(url, f"random-{args.model}", conversations, args.concurrency,
                                                args.reply_tokens, tok))
        wall = time.perf_counter() - start
        hits = metrics_sample(port, "rwkv7_prefix_cache_lookups_total", 'result="hit"') - hits0
        misses = metrics_sample(port, "rwkv7_prefix_cache_lookups_total", 'result="miss"') - misses0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    rows = per_turn(results)
    later = [t for conv in results for t in conv[1:]]
    steady = results[args.concurrency:]
    return {"prefix_cache_mb": cache_mb, "wall_s": wall, "turns": rows,
            "ttft_last_over_first": _ratio(rows),
            "ttft_last_over_first_steady": _ratio(per_turn(steady)) if steady else None,
            "hit_rate_lookups": hits / (hits + misses) if hits + misses else None,
            "hit_share_after_turn_1": float(np.mean([t["cached_tokens"] > 0 for t in later])) if later else None,
            "prefill_tokens_computed": int(sum(t["prompt_tokens"] - t["cached_tokens"] for c in results for t in c)),
            "prompt_tokens": int(sum(t["prompt_tokens"] for c in results for t in c)),
            "finish_reasons": {r: sum(t["finish_reason"] == r for c in results for t in c)
                               for r in ("stop", "length")},
            "records": [[{k: t[k] for k in ("prompt_tokens", "cached_tokens", "completion_tokens", "reply_ids",
                                            "finish_reason", "ttft")} for t in conv] for conv in results],
            "replies": [[t["content"] for t in conv] for conv in results]}


def _ratio(rows: list[dict]) -> float | None:
    """Mean TTFT of the last turn over the first's."""
    first, last = rows[0]["ttft_ms_mean"], rows[-1]["ttft_ms_mean"]
    return last / first if first and last else None


def markdown(result: dict) -> str:
    a = result["args"]
    lines = [f"# Multi-turn chat: {a['model']}, {a['conversations']} conversations x {a['turns']} turns, "
             f"concurrency {a['concurrency']}", "",
             f"user messages {a['user_tokens'][0]}-{a['user_tokens'][1]} tokens, replies <= {a['reply_tokens']} "
             f"tokens (greedy), backend {a['backend']}, {result['machine']}", "",
             "| turn | prompt tok | new tok | computed, cache on | computed, cache off | TTFT ms on | TTFT ms off |",
             "|---|---|---|---|---|---|---|"]
    for on, off in zip(result["on"]["turns"], result["off"]["turns"]):
        lines.append(f"| {on['turn']} | {on['prompt_tokens']:.0f} | {on['new_tokens']:.0f} | "
                     f"{on['computed_tokens']:.0f} | {off['computed_tokens']:.0f} | {on['ttft_ms_mean']:.0f} | "
                     f"{off['ttft_ms_mean']:.0f} |")
    lines.append("")
    for side in ("on", "off"):
        s = result[side]
        steady = s["ttft_last_over_first_steady"]
        lines.append(f"- cache {side}: TTFT turn {a['turns']} / turn 1 = {s['ttft_last_over_first']:.2f}x "
                     f"(steady state: {'n/a' if steady is None else f'{steady:.2f}x'}), "
                     f"prefill tokens computed {s['prefill_tokens_computed']} of {s['prompt_tokens']}, "
                     f"lookup hit rate {s['hit_rate_lookups'] if s['hit_rate_lookups'] is None else round(s['hit_rate_lookups'], 3)}, "
                     f"turns after the first that hit {s['hit_share_after_turn_1']:.3f}, wall {s['wall_s']:.1f} s, "
                     f"finish reasons {s['finish_reasons']}")
    lines.append(f"- replies identical with and without the cache: {result['identical']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-world", help="random model name with the World vocabulary")
    ap.add_argument("--backend", default="jax")
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--user-tokens", type=int, nargs=2, default=(20, 200))
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--prefix-cache-mb", type=float, default=1024.0, help="the cache-on side's budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--tag", default=None)
    ap.add_argument("--smoke", action="store_true", help="2 conversations x 3 turns, short messages")
    args = ap.parse_args(argv)
    if args.smoke:
        args.conversations, args.turns, args.concurrency, args.user_tokens, args.reply_tokens = 2, 3, 2, (5, 20), 8
    args.max_batch = args.concurrency
    tag = args.tag or ("smoke" if args.smoke else f"cpu_{args.model}")
    tok = WorldTokenizer()
    conversations = make_conversations(tok, args.conversations, args.turns, tuple(args.user_tokens), args.seed)
    result = {"args": {k: v for k, v in vars(args).items() if k != "prompt_len"},
              "machine": f"{platform.machine()} {platform.processor() or ''}".strip()}
    for side, mb in (("on", args.prefix_cache_mb), ("off", 0.0)):
        result[side] = run_side(args, conversations, tok, mb)
        shown = {k: v for k, v in result[side].items() if k not in ("replies", "records")}
        print(f"cache {side}: {json.dumps(shown)}", flush=True)
    result["identical"] = result["on"]["replies"] == result["off"]["replies"]
    for side in ("on", "off"):  # the texts of random weights: only their digest is kept
        replies = result[side].pop("replies")
        result[side]["replies_sha256"] = hashlib.sha256(json.dumps(replies).encode()).hexdigest()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"multi_turn_{tag}.json").write_text(json.dumps(result, indent=1))
    (out / f"multi_turn_{tag}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
