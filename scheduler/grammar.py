"""Grammar-constrained decoding with llguidance: compile a ``Constraint`` once, match each
sequence's tokens against it, and compute the packed allowed-token masks of a batch.

llguidance was chosen by measurement (benchmarks/results/grammar_engines.md: on the World
vocabulary it compiles a schema in tens of ms and builds its tokenizer in ~1 s, a mask takes
~0.03 ms at the median (tens of ms at worst), it takes partial UTF-8 tokens correctly, reads
regex, Lark and JSON schema directly and needs no other package). It gets the
tokenizer's byte string of every id (``decode_bytes([i])``; end-of-text, id 0, is its EOS).
JSON is compact (no whitespace between tokens), so a model cannot pad forever with blanks.

``Grammars(tokenizer, vocab_size, limits)`` holds the engine's tokenizer and a cache of
compiled constraints keyed by (kind, text), bounded in bytes of memory measured at compile;
``matcher(constraint)`` validates (ValueError, one line naming the problem, before any
decode work; GrammarLimitError beyond a bound of scheduler/grammar_limits.py) and returns a
fresh ``Matcher`` for one sequence. Every compile runs on one thread with a large stack
(scheduler/grammar_worker.py); ``submit`` hands an event loop a Future of it.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from rwkv7_core.constants import END_OF_TEXT
from rwkv7_core.engine import Capability
from rwkv7_core.token_mask import mask_words

from .constraint import Constraint
from .grammar_limits import GrammarLimitError, GrammarLimits, check, ll_limits
from .grammar_worker import CompileThread

if TYPE_CHECKING:  # llguidance itself is imported when the first grammar is made; the type is in its stubs
    from llguidance._lib import JsonCompileOptions

JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class Matcher:
    """One sequence's position in its constraint: ``consume(token)`` advances it; ``done``
    once the grammar is complete and nothing but end-of-text may follow; ``error`` when a
    token broke it (None while fine)."""

    def __init__(self, ll_matcher):
        self.ll = ll_matcher

    def consume(self, token: int) -> None:
        self.ll.consume_token(int(token))

    @property
    def done(self) -> bool:
        return self.ll.is_stopped() and not self.ll.is_error()

    @property
    def error(self) -> str | None:
        return first_line(self.ll.get_error()) if self.ll.is_error() else None

    def mask(self, vocab_size: int) -> np.ndarray:
        """int32 [W]: the packed mask of the tokens allowed next."""
        out = np.zeros(mask_words(vocab_size), np.int32)
        self.ll.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        return out


class Grammars:
    """Compiles constraints for one tokenizer (see the module docstring); thread-safe."""

    def __init__(self, tokenizer, vocab_size: int, limits: GrammarLimits | None = None):
        import llguidance

        self._ll = llguidance
        self.vocab_size = vocab_size
        self.limits = limits or GrammarLimits()
        tokens = [tokenizer.decode_bytes([i]) if i != END_OF_TEXT else b"" for i in range(vocab_size)]
        single = {t: i for i, t in enumerate(tokens) if len(t) == 1}
        encode = getattr(tokenizer, "encode", None) or (  # a tokenizer without encode: byte by byte
            lambda text: [single[bytes([b])] for b in text.encode() if bytes([b]) in single])

        class Wrapped:  # llguidance's TokenizerWrapper input
            eos_token_id, bos_token_id, special_token_ids = END_OF_TEXT, None, [END_OF_TEXT]

            def __init__(self):
                self.tokens = tokens

            def __call__(self, text: str) -> list[int]:
                return list(encode(text))

        self._tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()), n_vocab=vocab_size,
                                                 eos_token=END_OF_TEXT)
        self._cache: OrderedDict[Constraint, tuple[object, int]] = OrderedDict()  # -> (template, bytes)
        self.cache_bytes = 0
        self._refused: OrderedDict[bytes, tuple[str | None, str]] = OrderedDict()  # digest -> (limit, message)
        self._lock = threading.Lock()

    @property
    def cache_entries(self) -> int:
        """Compiled constraints in the cache (``cache_bytes``: the memory they were measured to take)."""
        return len(self._cache)

    def set_limits(self, limits: GrammarLimits) -> None:
        """Use ``limits`` from now on (the cache, compiled under the old ones, is emptied)."""
        with self._lock:
            self.limits = limits
            self._cache.clear()
            self._refused.clear()
            self.cache_bytes = 0

    def _grammar(self, c: Constraint) -> str:
        """llguidance's grammar text of a constraint."""
        M = self._ll.LLMatcher
        if c.kind in ("json_schema", "json_object"):
            schema = json.loads(c.spec) if c.kind == "json_schema" else {"type": "object"}
            return M.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        if c.kind == "regex":
            return M.grammar_from_regex(c.spec)
        if c.kind == "choice":
            return M.grammar_from_lark("start: " + " | ".join(json.dumps(s) for s in json.loads(c.spec)))
        return M.grammar_from_lark(c.spec)

    def _cached(self, c: Constraint) -> Any:
        """The cached template of ``c`` (None when not cached); its error again when it was refused."""
        with self._lock:
            held = self._cache.get(c)
            if held is not None:
                self._cache.move_to_end(c)
                return held[0]
            refused = self._refused.get(_digest(c))
        if refused is not None:
            limit, message = refused
            raise GrammarLimitError(limit, message) if limit else ValueError(message)
        return None

    def compiled(self, c: Constraint) -> Any:
        """The validated, untouched matcher of a constraint (cached; compiled on the compile
        thread); ValueError (GrammarLimitError for a limit) naming the problem."""
        held = self._cached(c)
        return held if held is not None else compile_thread().run(lambda: self._compile(c))

    def submit(self, c: Constraint) -> Future:
        """``compiled(c)`` as a Future, for a caller that must not block (an event loop)."""
        held = self._cached(c)
        if held is None:
            return compile_thread().submit(lambda: self._compile(c))
        done: Future = Future()
        done.set_result(held)
        return done

    def _compile(self, c: Constraint) -> Any:
        """``_compile_new(c)``, its refusal remembered (by digest) so a repeat costs nothing."""
        held = self._cached(c)  # compiled (or refused) while this one waited its turn
        if held is not None:
            return held
        try:
            return self._compile_new(c)
        except ValueError as e:
            with self._lock:
                self._refused[_digest(c)] = (e.limit if isinstance(e, GrammarLimitError) else None, str(e))
                while len(self._refused) > REFUSED_KEPT:
                    self._refused.popitem(last=False)
            raise

    def _compile_new(self, c: Constraint) -> Any:
        """Check, compile and first-mask ``c`` (on the compile thread), measuring the memory
        it took; cache it within ``limits.cache_mb``."""
        limits = self.limits
        check(c, limits)
        name = c.kind.replace("_", " ")
        before = resident_bytes()
        try:
            grammar = self._grammar(c)
        except ValueError as e:
            raise ValueError(f"invalid {name}: {first_line(str(e))}") from None
        template = self._ll.LLMatcher(self._tokenizer, grammar, log_level=0,
                                      limits=self._ll.LLParserLimits(**ll_limits(limits)))
        if not template.is_error():
            Matcher(template.deep_copy()).mask(self.vocab_size)  # builds the lexer the template shares
        if template.is_error():
            raise ValueError(f"invalid {name}: {first_line(template.get_error())}")
        cost = max(resident_bytes() - before, len(c.spec))
        if cost > limits.max_automaton_mb * 2**20:
            raise GrammarLimitError("max_automaton_mb", f"the {name} compiles to {cost / 2**20:.0f} MB, more "
                                                        f"than the limit max_automaton_mb={limits.max_automaton_mb}")
        with self._lock:
            self._cache[c] = (template, cost)
            self.cache_bytes += cost
            while self.cache_bytes > limits.cache_mb * 2**20 and len(self._cache) > 1:
                self.cache_bytes -= self._cache.popitem(last=False)[1][1]
        return template

    def matcher(self, c: Constraint) -> Matcher:
        """A fresh Matcher of ``c`` for one sequence (ValueError when ``c`` is invalid)."""
        return Matcher(self.compiled(c).deep_copy())


REFUSED_KEPT = 1024
"""Refused constraints remembered (by digest, least recently refused dropped first)."""


def _digest(c: Constraint) -> bytes:
    return hashlib.sha256(c.kind.encode() + b"\0" + c.spec.encode()).digest()


def resident_bytes() -> int:
    """The process's resident memory (Linux /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


_COMPILE: list[CompileThread] = []


def compile_thread() -> CompileThread:
    """The process's one compile thread (scheduler/grammar_worker.py), started on first use."""
    with _SHARED_LOCK:
        if not _COMPILE:
            _COMPILE.append(CompileThread())
        return _COMPILE[0]


def first_line(message: str, limit: int = 300) -> str:
    """An engine message as one line: its non-empty lines joined, at most ``limit`` characters."""
    parts = (part.strip() for part in message.replace("<non-verbose/>", "").splitlines())
    line = " ".join(part for part in parts if part) or "unknown error"
    return line if len(line) <= limit else line[:limit - 3] + "..."


_EXECUTOR: list[Any] = []  # the one llguidance.LLExecutor, made on first use


def fill_masks(rows: list[tuple[int, Matcher]], out: np.ndarray) -> None:
    """Write the masks of (row, matcher) pairs into those rows of ``out`` int32 [B, W], C
    order (in parallel over the matchers, on llguidance's threads)."""
    if not rows:
        return
    if not _EXECUTOR:
        import llguidance
        _EXECUTOR.append(llguidance.LLExecutor())
    _EXECUTOR[0].unsafe_compute_mask_ptr([(m.ll, r) for r, m in rows], out.ctypes.data, out.shape[1] * 4,
                                         out.shape[0])


_SHARED: dict[int, tuple[object, Grammars]] = {}
_SHARED_LOCK = threading.Lock()
_LIMITS: list[GrammarLimits] = [GrammarLimits()]


def set_limits(limits: GrammarLimits) -> None:
    """The process's grammar limits (the ``--grammar-*`` options), for every ``Grammars``."""
    with _SHARED_LOCK:
        _LIMITS[0] = limits
        held = [g for _, g in _SHARED.values()]
    for grammars in held:
        grammars.set_limits(limits)


def current_limits() -> GrammarLimits:
    """The process's grammar limits (``set_limits``)."""
    return _LIMITS[0]


def grammars_for(tokenizer, vocab_size: int) -> Grammars:
    """The process's one ``Grammars`` of ``tokenizer`` (built on first use, or at start-up by
    the server and batch job), shared by every scheduler and the server's request checks."""
    with _SHARED_LOCK:
        held = _SHARED.get(id(tokenizer))
        if held is None or held[0] is not tokenizer or held[1].vocab_size != vocab_size:
            held = _SHARED[id(tokenizer)] = (tokenizer, Grammars(tokenizer, vocab_size, _LIMITS[0]))
        return held[1]


def matcher_for(constraint: Constraint, engine, tokenizer) -> Matcher:
    """A fresh Matcher of ``constraint`` for a request on ``engine``; ValueError (one line)
    when the engine cannot mask tokens, there is no tokenizer, or the constraint is invalid."""
    if Capability.TOKEN_MASK not in engine.capabilities:
        raise ValueError(f"constrained decoding needs an engine with {Capability.TOKEN_MASK}; "
                         f"{type(engine).__name__} does not declare it")
    if tokenizer is None:
        raise ValueError("constrained decoding needs a tokenizer (a model with the World vocabulary)")
    return grammars_for(tokenizer, engine.vocab_size).matcher(constraint)
