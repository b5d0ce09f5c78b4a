"""Compare grammar engines (llguidance, xgrammar, outlines-core) on the World vocabulary.

Each engine gets the World tokenizer's 65,536 byte strings (ids without an entry, and 0 =
end-of-text, as empty/stop tokens) and a JSON schema; a seeded random walk draws an allowed
token each step: half the time one holding a JSON delimiter (quote, brace, bracket, comma,
colon) when any is allowed, else a uniformly random one, so documents complete and every
grammar state is visited (a uniform walk stays inside strings). Reported per engine: grammar compile seconds, the mean/p50/p99
host time of one step's packed mask ([V/32] int32) and of consuming the drawn token, and the
multi-byte UTF-8 check: inside a JSON string, a token holding only the first byte(s) of a
multi-byte character must be allowed, and after it exactly the continuations that complete
the character (the World vocabulary splits many CJK characters this way).

    python benchmarks/grammar_engines.py --steps 300 --out benchmarks/results/grammar_engines.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from rwkv7_core.tokenizer import WorldTokenizer

V = 65536
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string",
                                                                                        "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "tags", "address"], "additionalProperties": False}
STRING_SCHEMA = {"type": "string"}


def vocab() -> list[bytes]:
    table = WorldTokenizer()._table()
    return [table.get(i, b"") for i in range(V)]


def partial_utf8_pair(tokens: list[bytes]) -> tuple[int, int]:
    """(a token holding only the leading byte(s) of a multi-byte character, a token of
    continuation bytes that completes it)."""
    continuations = [i for i, b in enumerate(tokens) if b and all(0x80 <= c < 0xC0 for c in b)]
    for i, b in enumerate(tokens):
        if len(b) == 1 and b[0] >= 0xE0:  # a lone lead byte of a 3- or 4-byte character
            for j in continuations:
                try:
                    (b + tokens[j]).decode("utf-8")
                    return i, j
                except UnicodeDecodeError:
                    continue
    raise RuntimeError("no split multi-byte character in the vocabulary")


def allowed_ids(bitmask: np.ndarray) -> np.ndarray:
    bits = (bitmask.view(np.uint32)[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    return np.flatnonzero(bits.reshape(-1)[:V])


class Llguidance:
    name = "llguidance"

    def __init__(self, tokens):
        import llguidance

        class Wrap:
            eos_token_id, bos_token_id, special_token_ids = 0, None, [0]

            def __init__(self):
                self.tokens, self.encode = tokens, WorldTokenizer().encode

            def __call__(self, s: str):
                return self.encode(s)

        self.ll = llguidance
        self.tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrap()), n_vocab=V, eos_token=0)

    def matcher(self, schema):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema)
        m = self.ll.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return m

    def fill(self, m, mask):
        m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)

    def consume(self, m, token):
        ok = m.consume_token(token)
        return ok and not m.is_stopped()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokens):
        import xgrammar as xgr
        self.xgr = xgr
        info = xgr.TokenizerInfo(tokens, xgr.VocabType.RAW, vocab_size=V, stop_token_ids=[0])
        self.compiler = xgr.GrammarCompiler(info)

    def matcher(self, schema):
        return self.xgr.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema)))

    def fill(self, m, mask):
        import torch
        t = torch.from_numpy(mask[None])
        m.fill_next_token_bitmask(t, 0)

    def consume(self, m, token):
        return m.accept_token(token) and not m.is_terminated()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokens):
        import outlines_core as oc
        self.oc = oc
        mapping = {}
        for i, b in enumerate(tokens):
            if b and i:
                mapping.setdefault(b, []).append(i)
        self.vocab = oc.Vocabulary(0, mapping)

    def matcher(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Guide(self.oc.Index(regex, self.vocab))

    def fill(self, m, mask):
        m.write_mask_into(mask.ctypes.data, mask.size, mask.itemsize)

    def consume(self, m, token):
        m.advance(token)
        return not m.is_finished()


def walk(engine, schema, steps: int, seed: int, tokens: list[bytes]) -> dict:
    rng = np.random.default_rng(seed)
    delimiter = np.array([any(c in t for c in b'"{}[],:') for t in tokens])
    t0 = time.perf_counter()
    m = engine.matcher(schema)
    compile_s = time.perf_counter() - t0
    mask = np.zeros(V // 32, np.int32)
    mask_s, consume_s, restarts = [], [], 0
    for _ in range(steps):
        t = time.perf_counter()
        engine.fill(m, mask)
        mask_s.append(time.perf_counter() - t)
        ids = allowed_ids(mask[None])
        ids = ids[ids != 0] if len(ids) > 1 else ids
        structural = ids[delimiter[ids]]
        token = int(rng.choice(structural if len(structural) and rng.random() < 0.5 else ids))
        t = time.perf_counter()
        going = engine.consume(m, token) if token != 0 else False
        consume_s.append(time.perf_counter() - t)
        if not going:
            m, restarts = engine.matcher(schema), restarts + 1
    ms = lambda xs, q: 1e3 * float(np.quantile(xs, q))  # noqa: E731
    return dict(compile_s=round(compile_s, 4), mask_ms_mean=round(1e3 * statistics.fmean(mask_s), 4),
                mask_ms_p50=round(ms(mask_s, 0.5), 4), mask_ms_p99=round(ms(mask_s, 0.99), 4),
                consume_ms_mean=round(1e3 * statistics.fmean(consume_s), 4), documents_completed=restarts)


def utf8_check(engine, tokens) -> dict:
    lead, rest = partial_utf8_pair(tokens)
    quote = tokens.index(b'"')
    m = engine.matcher(STRING_SCHEMA)
    mask = np.zeros(V // 32, np.int32)
    engine.consume(m, quote)
    engine.fill(m, mask)
    lead_ok = bool(lead in set(allowed_ids(mask[None]).tolist()))
    engine.consume(m, lead)
    engine.fill(m, mask)
    after = allowed_ids(mask[None])
    only_continuations = all(tokens[i][:1] and 0x80 <= tokens[i][0] < 0xC0 for i in after)
    return dict(partial_token_allowed=lead_ok, completion_allowed=bool(rest in set(after.tolist())),
                only_continuations_after_partial=bool(only_continuations), allowed_after_partial=int(len(after)))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    tokens = vocab()
    results = {}
    for cls in (Llguidance, Xgrammar, OutlinesCore):
        try:
            t = time.perf_counter()
            engine = cls(tokens)
            setup = time.perf_counter() - t
            results[cls.name] = dict(tokenizer_setup_s=round(setup, 3), **walk(engine, SCHEMA, args.steps, 0, tokens),
                                     utf8=utf8_check(engine, tokens))
        except Exception as e:  # an engine that cannot run here is reported, not fatal
            results[cls.name] = dict(error=f"{type(e).__name__}: {e}"[:300])
        print(cls.name, json.dumps(results[cls.name]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(vocab=V, steps=args.steps, schema=SCHEMA, engines=results), f, indent=1)
    return results


if __name__ == "__main__":
    main()
