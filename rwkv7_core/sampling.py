"""Sampling parameters and batched sampling: the numpy reference that the JAX and torch
engines implement on device.

Per row (a request), for the token at output position ``pos``:
1. ``bad = any(!isfinite(logits))`` -> token NONFINITE_TOKEN.
2. ``x = logits - presence * (counts > 0) - frequency * counts``, banned tokens -> -inf.
   ``counts`` are the request's own output tokens, decayed: each step
   ``counts = counts * decay + onehot(last_token)`` (RWKV-style penalties).
3. ``temperature == 0`` -> ``argmax(x)`` (first index on ties).
4. else ``z = x / temperature``; keep the top_k largest (0 = all), then the smallest set of
   largest whose softmax mass reaches top_p (ties at the threshold kept; top_p = 1 keeps all
   the top-k survivors, whatever rounding does to the cumulative mass); draw by Gumbel-max:
   ``argmax(z + gumbel)`` over kept tokens.
The Gumbel noise is a counter-based hash of (seed, pos, token id) -- no RNG state, so a
row's draws depend on nothing but its own seed and position (batch- and bucket-invariant,
and the same in every framework):
``key = h((lo + h(pos + 1)) ^ h(hi))`` for the seed's 32-bit words ``lo``, ``hi`` (seeds are 64-bit;
``h(0) = 0``, so a seed below 2**32 keys as ``h(seed + h(pos + 1))``), ``bits[v] = h(key ^ h(v + GOLDEN))``,
``u = ((bits >> 8) + 0.5) / 2**24``, ``gumbel = -log(-log(u))``, all uint32 arithmetic with
``h`` = lowbias32 (xor-shift 16, * HASH_M1, xor-shift 15, * HASH_M2, xor-shift 16).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from .constants import END_OF_TEXT

NONFINITE_TOKEN = -1
"""Drawn in place of a token for a row whose logits held NaN or inf."""


class SamplingFieldError(ValueError):
    """One sampling field's value is invalid: ``field`` names it (a ``SamplingParams``
    field), ``why`` says what is wrong; the message is ``where`` + ``why``."""

    def __init__(self, field: str, why: str, where: str):
        super().__init__(where + why)
        self.field, self.why, self.where = field, why, where

    def __reduce__(self):  # pickled (e.g. to a Ray driver) with its fields
        return type(self), (self.field, self.why, self.where)


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded; applied on the device, row by row.

    Order per generated token: logits (float32) -> banned tokens set to -inf -> penalties
    (``presence_penalty`` once for every token seen so far, ``frequency_penalty`` times its
    decayed count; counts decay by ``penalty_decay`` each step, RWKV style) -> greedy argmax
    when ``temperature == 0``, else divide by temperature -> top-k -> top-p -> draw.
    ``stop_tokens`` end the request and are not emitted (default: end-of-text 0; an explicit
    list replaces the default). ``stop`` strings are matched on decoded text when the
    scheduler has a tokenizer. ``seed`` fixes the draws; the same request and seed give the
    same tokens whatever batch or bucket it runs in. ``logprobs`` (None = off, else 0 to
    TOP_LOGPROBS) asks for each emitted token's ``TokenLogprobs`` with that many alternatives
    (needs an engine with ``Capability.LOGPROBS``; the draws do not change).
    """
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_decay: float = 1.0
    banned_tokens: tuple[int, ...] = ()
    stop_tokens: tuple[int, ...] = (END_OF_TEXT,)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: int | None = None

    def __post_init__(self):
        for name in ("banned_tokens", "stop_tokens", "stop"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise SamplingFieldError(name, f"must be a list, got {value!r}", f"SamplingParams.{name} ")
            object.__setattr__(self, name, tuple(value))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SamplingParams":
        """Build from a mapping of field names; an unknown field raises ValueError naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sampling field(s): {', '.join(unknown)}")
        return cls(**d).validate()

    def replace(self, **changes) -> "SamplingParams":
        return dataclasses.replace(self, **changes)

    def validate(self, vocab_size: int | None = None, max_tokens_limit: int | None = None) -> "SamplingParams":
        """Return self, or raise ValueError naming the first invalid field and the limit it
        breaks (``max_tokens_limit``: the commands' ``--max-tokens-limit``, None = none but
        DEVICE_INT_MAX; MAX_STOP_STRINGS, MAX_STOP_LENGTH, MAX_STOP_TOKENS)."""
        def bad(name, why):
            value = repr(getattr(self, name))
            raise SamplingFieldError(name, why, f"SamplingParams.{name}={value if len(value) <= 80 else value[:60] + '...'}: ")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        def is_real(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        for spec in SCALAR_FIELDS:
            value = getattr(self, spec.name)
            if not (is_int(value) if spec.kind is int else is_real(value)) or not spec.holds(value):
                bad(spec.name, spec.rule)
            if spec.name == "max_tokens" and max_tokens_limit is not None and value > max_tokens_limit:
                bad("max_tokens", f"{value} exceeds the limit {max_tokens_limit} (--max-tokens-limit)")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed <= SEED_MAX):
            bad("seed", "must be an integer in [0, 2**64 - 1] or None")
        if len(self.stop_tokens) > MAX_STOP_TOKENS:
            bad("stop_tokens", f"{len(self.stop_tokens)} stop tokens, more than the limit {MAX_STOP_TOKENS}")
        for name in ("banned_tokens", "stop_tokens"):
            for t in getattr(self, name):
                if not is_int(t) or t < 0 or (vocab_size is not None and t >= vocab_size):
                    bad(name, f"token {t!r} is not an id in [0, {vocab_size or 'vocab_size'})")
        if vocab_size is not None and len(set(self.banned_tokens)) >= vocab_size:
            bad("banned_tokens", "bans every token")
        if len(self.stop) > MAX_STOP_STRINGS:
            bad("stop", f"{len(self.stop)} stop strings, more than the limit {MAX_STOP_STRINGS}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                bad("stop", "stop strings must be non-empty strings")
            if len(s) > MAX_STOP_LENGTH:
                bad("stop", f"a stop string of {len(s)} characters, longer than the limit {MAX_STOP_LENGTH}")
        if self.logprobs is not None and (not is_int(self.logprobs) or not 0 <= self.logprobs <= TOP_LOGPROBS):
            bad("logprobs", f"must be None or an integer in [0, {TOP_LOGPROBS}]")
        return self


TOP_LOGPROBS = 20
"""Alternatives an engine returns per scored token: the most a request may ask for."""

DEVICE_INT_MAX = 2**31 - 1
"""The largest ``max_tokens`` and ``top_k``: engines keep both as int32 per row (a top_k at or
above the vocabulary size keeps every token, as 0 does)."""

MAX_TOKENS_LIMIT = 65536
"""The commands' default ``--max-tokens-limit``: an RWKV row's memory does not grow with its
output, so the cap bounds time, not memory -- how long one request may hold a decode slot
(65536 tokens: minutes to hours of one slot, far above any chat or completion answer)."""



class ScalarField(NamedTuple):
    """One numeric ``SamplingParams`` field, declared once: its type, bounds (``ge``/``gt``
    lower, ``le`` upper; None = unbounded), the rule a bad value breaks and a help line. The
    validation, the commands' options and the server's request fields derive from these."""
    name: str
    kind: type          # int or float (an int is a valid float)
    ge: float | None
    gt: float | None
    le: float | None
    rule: str           # the error text of a value that breaks it
    help: str

    def holds(self, value: float) -> bool:
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le))

    def bounds(self) -> dict[str, float]:
        """{ge, gt, le} of the bounds it has (pydantic ``Field`` keywords)."""
        return {k: v for k, v in (("ge", self.ge), ("gt", self.gt), ("le", self.le)) if v is not None}


SCALAR_FIELDS = (
    ScalarField("max_tokens", int, 0, None, DEVICE_INT_MAX, f"must be an integer in [0, {DEVICE_INT_MAX}]",
                "most tokens to generate"),
    ScalarField("temperature", float, 0, None, None, "must be a finite number >= 0", "0 = greedy"),
    ScalarField("top_p", float, None, 0, 1, "must lie in (0, 1]", "nucleus sampling: the smallest set of "
                "tokens whose probability reaches it (1 = off)"),
    ScalarField("top_k", int, 0, None, DEVICE_INT_MAX,
                f"must be an integer in [0, {DEVICE_INT_MAX}] (0 = no top-k)", "0 = off"),
    ScalarField("presence_penalty", float, None, None, None, "must be a finite number",
                "subtracted once from the logit of every token seen so far"),
    ScalarField("frequency_penalty", float, None, None, None, "must be a finite number",
                "subtracted from a token's logit times its decayed count"),
    ScalarField("penalty_decay", float, None, 0, 1, "must lie in (0, 1]",
                "the counts of frequency_penalty decay by this factor each step"),
)
"""The numeric sampling fields, in ``SamplingParams`` order."""

MAX_STOP_STRINGS = 64
MAX_STOP_LENGTH = 512
MAX_STOP_TOKENS = 64
"""Most stop strings, characters per stop string and stop token ids in one request. OpenAI
allows 4 stop strings; these are generous for any real use (vLLM sets no cap) while bounding
what a request costs the others: stop strings are matched per generated character, and every
row of the decode batch is checked against the longest stop-token list in the batch."""


class TokenLogprobs(NamedTuple):
    """Log-probabilities of N scored tokens under the model's own distribution: log_softmax
    of the float32 logits, before bans, penalties and temperature (what evaluation harnesses
    score). ``top_ids`` are the TOP_LOGPROBS most likely tokens, most likely first (lower id
    first on ties)."""
    chosen: np.ndarray        # float32 [N]: the scored (drawn or given) token's logprob
    top_ids: np.ndarray       # int32 [N, TOP_LOGPROBS]
    top_logprobs: np.ndarray  # float32 [N, TOP_LOGPROBS]

    def row(self, i: int) -> "TokenLogprobs":
        """Row i as a TokenLogprobs of N=1 (numpy arrays)."""
        return TokenLogprobs(*(np.asarray(a[i:i + 1]) for a in self))


SEED_MAX = 2**64 - 1
"""The largest seed: engines hold a seed as two uint32 words (``SamplingRows.seed``, ``seed_hi``)."""

HASH_M1 = 0x7FEB352D
HASH_M2 = 0x846CA68B
GOLDEN = 0x9E3779B9


class SamplingRows(NamedTuple):
    """Per-row sampling parameters, each a [B] array."""
    temperature: np.ndarray  # float32
    top_p: np.ndarray        # float32
    top_k: np.ndarray        # int32, 0 = off
    presence: np.ndarray     # float32
    frequency: np.ndarray    # float32
    decay: np.ndarray        # float32
    seed: np.ndarray         # uint32: the seed's low 32 bits
    seed_hi: np.ndarray      # uint32: its high 32 bits


def sampling_rows(params: Sequence[SamplingParams]) -> SamplingRows:
    """Stack per-request parameters into [B] arrays (a None seed counts as 0)."""
    seeds = np.array([0 if p.seed is None else p.seed for p in params], np.uint64)
    return SamplingRows(
        temperature=np.array([p.temperature for p in params], np.float32),
        top_p=np.array([p.top_p for p in params], np.float32),
        top_k=np.array([p.top_k for p in params], np.int32),
        presence=np.array([p.presence_penalty for p in params], np.float32),
        frequency=np.array([p.frequency_penalty for p in params], np.float32),
        decay=np.array([p.penalty_decay for p in params], np.float32),
        seed=(seeds & np.uint64(0xFFFFFFFF)).astype(np.uint32), seed_hi=(seeds >> np.uint64(32)).astype(np.uint32))


def banned_mask(params: Sequence[SamplingParams], vocab_size: int) -> np.ndarray:
    """bool [B, V]: True where the row bans the token."""
    mask = np.zeros((len(params), vocab_size), bool)
    for i, p in enumerate(params):
        mask[i, list(p.banned_tokens)] = True
    return mask


def lowbias32(x: np.ndarray) -> np.ndarray:
    """The 32-bit integer hash ``h`` (uint32 in, uint32 out)."""
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(HASH_M1)
        x ^= x >> np.uint32(15)
        x *= np.uint32(HASH_M2)
        x ^= x >> np.uint32(16)
    return x


def gumbel_noise(seed: np.ndarray, seed_hi: np.ndarray, position: np.ndarray, vocab_size: int) -> np.ndarray:
    """float32 [B, V] Gumbel noise for rows with seeds (uint32 low and high words [B]) at
    output positions [B]."""
    with np.errstate(over="ignore"):
        key = seed.astype(np.uint32) + lowbias32(position.astype(np.uint32) + np.uint32(1))
        key = lowbias32(key ^ lowbias32(seed_hi))
        token_hash = lowbias32(np.arange(vocab_size, dtype=np.uint32) + np.uint32(GOLDEN))
    bits = lowbias32(key[:, None] ^ token_hash[None, :])
    u = ((bits >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -24)
    return -np.log(-np.log(u))


def penalized_logits(logits: np.ndarray, counts: np.ndarray, rows: SamplingRows,
                     banned: np.ndarray) -> np.ndarray:
    """float32 [B, V]: logits with presence/frequency penalties and bans applied."""
    x = logits.astype(np.float32) - rows.presence[:, None] * (counts > 0) - rows.frequency[:, None] * counts
    return np.where(banned, -np.inf, x).astype(np.float32)


def nucleus_mask(z: np.ndarray, top_k: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """bool [B, V]: tokens kept by top-k then top-p on temperature-scaled logits z [B, V]."""
    sorted_z = -np.sort(-z, axis=1)
    rank = np.arange(z.shape[1])[None, :]
    sorted_z = np.where((top_k[:, None] > 0) & (rank >= top_k[:, None]), -np.inf, sorted_z)
    p = np.exp(sorted_z - sorted_z[:, :1])
    p = p / p.sum(axis=1, keepdims=True)
    keep = (((np.cumsum(p, axis=1) - p) < top_p[:, None]) | (top_p[:, None] >= 1)) & (sorted_z > -np.inf)
    last = (keep.sum(axis=1) - 1).clip(min=0)  # a NaN row keeps nothing: clamp
    threshold = np.take_along_axis(sorted_z, last[:, None], axis=1)
    return z >= threshold


def sample_rows(logits: np.ndarray, counts: np.ndarray, rows: SamplingRows, banned: np.ndarray,
                positions: np.ndarray) -> np.ndarray:
    """int32 [B] tokens drawn from float32 logits [B, V] (see the module docstring)."""
    x = penalized_logits(logits, counts, rows, banned)
    greedy = np.argmax(x, axis=1)
    temperature = np.where(rows.temperature > 0, rows.temperature, np.float32(1))
    z = x / temperature[:, None]
    keep = nucleus_mask(z, rows.top_k, rows.top_p)
    noisy = np.where(keep, z + gumbel_noise(rows.seed, rows.seed_hi, positions, x.shape[1]), -np.inf)
    tokens = np.where(rows.temperature > 0, np.argmax(noisy, axis=1), greedy)
    finite = np.isfinite(logits).all(axis=1)
    return np.where(finite, tokens, NONFINITE_TOKEN).astype(np.int32)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float32 [..., V] log-probabilities of float32 logits [..., V]."""
    x = logits.astype(np.float32)
    m = x.max(axis=-1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))).astype(np.float32)


def token_logprobs(logits: np.ndarray, tokens: np.ndarray, k: int = TOP_LOGPROBS) -> TokenLogprobs:
    """TokenLogprobs of tokens int [N] (a negative id, e.g. NONFINITE_TOKEN, scores as id 0)
    under float32 logits [N, V]; ``k`` alternatives per row."""
    lp = log_softmax(logits)
    ids = np.maximum(np.asarray(tokens), 0)
    chosen = np.take_along_axis(lp, ids[:, None], axis=1)[:, 0]
    top = np.argsort(-lp, axis=1, kind="stable")[:, :k]
    return TokenLogprobs(chosen, top.astype(np.int32), np.take_along_axis(lp, top, axis=1))


def update_counts(counts: np.ndarray, tokens: np.ndarray, decay: np.ndarray) -> np.ndarray:
    """Penalty counts after emitting ``tokens`` [B]: ``counts * decay + onehot(tokens)``."""
    counts = counts * decay[:, None]
    counts[np.arange(len(tokens)), tokens] += 1
    return counts
