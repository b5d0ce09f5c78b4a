"""The engine contract: what the scheduler needs from a model, in numpy types.

An engine owns the device-resident batch of the current bucket: ``bucket`` slots, each
holding one sequence's recurrent state plus its sampling state (parameters, penalty
counts, banned-token mask), kept together as ``Slots``. The scheduler decides which request
sits in which slot; the engine never sees request ids. Two kinds of handle cross over:

- ``Row``: one sequence's state after some tokens, opaque and device-resident (the engine's
  own type), plus the float32 logits [V] of its last position when it came from prefill.
- ``HostRow``: the same as a tuple of numpy arrays (for the host-side prefix cache); its
  size is ``host_row_bytes(row)``.

Every engine implements ``Engine``, stating its facts as plain values (``config``, ``dtype``,
``kernels``, ``device``, ``prefill_pieces``) so that callers never reach into its model.
Optional capabilities are declared, not inferred: an
engine lists the ``Capability`` members it has in its ``capabilities`` frozenset, and callers
test ``Capability.X in engine.capabilities`` (so a wrapper that forwards attributes, e.g.
the replica layer's EngineGuard, keeps them). Each capability's methods are documented by a
protocol of its own: ``VarlenPrefill`` (several prompt pieces flattened into one call) and
``MixedStep`` (a decode step that also carries prompt pieces), both taking at most
``MAX_PIECES`` pieces padded to ``token_rows`` flat tokens (``varlen_shape``);
``Logprobs`` (log-probabilities of drawn tokens and of a given prompt, sampling.py's
``TokenLogprobs``); ``TokenMask`` (``step``, ``step_logprobs``, ``mixed_step`` and
``sample`` also take ``allowed``, packed allowed-token masks of rwkv7_core/token_mask.py,
for grammar-constrained rows); ``ReportsCompiles`` (the engine tells a listener about every compile,
so throughput figures can leave compile time out); and ``Compiles`` (its ``compile*`` methods do
real work and may run on a second thread beside the steps, so a scheduler prepares the buckets
it is about to need ahead; an engine without it compiles nothing and costs nothing there).
``check_capabilities`` verifies that a declaration does not lie (the scheduler runs it once
per engine).

Rows are values: ``insert`` copies a row into its slot and never consumes or aliases it, so
one prefilled row may be inserted into several slots (``n`` choices of one prompt), each
slot then evolving on its own buffers.

Token draws are a pure function of (logits, penalty counts, params, seed, position), so a
request's tokens do not depend on its slot, its neighbours or the bucket (see sampling.py).
"""
from __future__ import annotations

import enum
import inspect
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import numpy as np

from .config import ModelConfig
from .sampling import NONFINITE_TOKEN, SamplingParams, SamplingRows, TokenLogprobs

__all__ = ["Capability", "Compiles", "Engine", "HostRow", "Logprobs", "MAX_PIECES", "MixedStep", "NONFINITE_TOKEN",
           "ReportsCompiles", "Row", "Slots", "TokenLogprobs", "TokenMask", "VarlenPrefill", "check_capabilities",
           "host_row_bytes", "varlen_shape"]

Row = Any
HostRow = tuple

MAX_PIECES = 8
"""Most prompt pieces one flattened call carries (its sequence rows are padded to this)."""


class Slots(NamedTuple):
    """The batch an engine owns; every leaf has a leading [bucket] axis (framework arrays)."""
    state: Any            # the model's State: att_shift [B, L, C], wkv [B, L, H, N, N], ffn_shift [B, L, C]
    counts: Any           # float32 [B, V] decayed penalty counts
    banned: Any           # bool [B, V]
    rows: SamplingRows    # [B] per-slot sampling parameters


class Capability(enum.Enum):
    """An optional part of the engine contract; ``methods``: the method names it adds (those
    of its protocol below)."""
    VARLEN_PREFILL = "varlen_prefill"
    MIXED_STEP = "mixed_step"
    LOGPROBS = "logprobs"
    REPORTS_COMPILES = "reports_compiles"
    TOKEN_MASK = "token_mask"
    COMPILES = "compiles"

    @property
    def methods(self) -> tuple[str, ...]:
        protocol = _PROTOCOLS[self]
        return tuple(n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_"))


class Engine(Protocol):
    capabilities: frozenset[Capability]  # the optional capabilities it implements
    vocab_size: int
    config: ModelConfig | None     # the model's shape (None: a test engine with no RWKV-7 model)
    dtype: str                     # the weights' dtype name, e.g. "float32", "bfloat16"
    kernels: str                   # the resolved kernel set, e.g. "xla", "pallas", "triton"
    device: str | None             # where the batch lives, e.g. "cuda:1"; None: the framework's default
    prefill_pieces: tuple[int, ...]  # prompt piece lengths prefill runs, largest first; (): any length at once
    bucket: int          # current number of slots; 0 before the first resize
    last_path: str       # kernel-path name of the last step (e.g. "B1T1", "BATCHED_DECODE")

    def compile(self, buckets: Sequence[int]) -> dict[int, float]:
        """Compile the decode step (and slot ops) for each bucket ahead of time;
        returns {bucket: seconds}. Already-compiled buckets cost ~0 and report 0.0."""

    def compile_prefill(self) -> dict[int, float]:
        """Compile what ``prefill`` and ``sample`` run, ahead of time; returns {piece length:
        seconds} (0.0 for what was compiled already)."""

    def prefill(self, tokens: np.ndarray, start: Row | None = None) -> Row:
        """Run tokens (int [T], T >= 1) from ``start`` (None = fresh zeros) as one sequence
        (B=1, T). Returns the row after the last token, holding its logits. Thread-safe with
        respect to step/insert/resize (it touches no slot); the scheduler calls it serially."""

    def sample(self, row: Row, params: SamplingParams, position: int = 0) -> int:
        """Draw a token from a prefilled row's logits with fresh (zero) penalty counts, exactly
        as ``step`` would for that row at ``position``; NONFINITE_TOKEN if the logits are not
        finite. ``params.seed`` must be an int."""

    def insert(self, slot: int, row: Row, params: SamplingParams) -> None:
        """Copy a row's state into ``slot`` (< bucket), set the slot's sampling parameters and
        clear its penalty counts. ``params.seed`` must be an int. The row stays valid and
        unchanged (it may be inserted again, into another slot)."""

    def extract(self, slot: int) -> Row:
        """A copy of the state in ``slot`` (no logits)."""

    def resize(self, keep_slots: Sequence[int], new_bucket: int) -> None:
        """Make the batch ``new_bucket`` slots: slot keep_slots[i] moves to slot i (with its
        sampling state); other slots hold unspecified data. len(keep_slots) <= new_bucket.
        With no slots to keep the engine builds a fresh batch: the scheduler relies on this
        after a failed step (whose state may be lost, e.g. donated buffers)."""

    def step(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """One decode step for all slots. tokens: int32 [bucket], each slot's last token
        (fed to the model; also counted for penalties); positions: int32 [bucket], the index
        of the token being drawn within the request's output (the seed's draw counter).
        Returns int32 [bucket]: the drawn tokens, NONFINITE_TOKEN for rows whose logits were
        not finite. Only the drawn tokens are fetched to the host."""

    def to_host(self, row: Row) -> HostRow:
        """Copy a row to numpy arrays: the state's leaves, then the logits (None when the row
        has none, as a row from ``extract``)."""

    def from_host(self, host_row: HostRow) -> Row:
        """Inverse of ``to_host``."""


class VarlenPrefill(Protocol):
    """``Capability.VARLEN_PREFILL``: several prompt pieces in one flattened prefill call."""

    def prefill_varlen(self, prompts: Sequence[np.ndarray], starts: Sequence[Row | None],
                       token_rows: int) -> list[Row]:
        """Pieces (int [T_i >= 1] each, 1..MAX_PIECES of them, sum T_i <= token_rows) in one
        forward padded to ``token_rows`` flat tokens; piece i continues from starts[i] (None =
        fresh). Returns one Row (with logits) per piece."""

    def compile_varlen(self, token_rows: int) -> float:
        """Compile ``prefill_varlen`` for ``token_rows`` ahead of time; seconds (0.0 if done)."""


class MixedStep(Protocol):
    """``Capability.MIXED_STEP``: one decode step of every slot that also carries prompt pieces."""

    def mixed_step(self, tokens: np.ndarray, positions: np.ndarray, prompts: Sequence[np.ndarray],
                   starts: Sequence[Row | None], token_rows: int) -> tuple[np.ndarray, list[Row]]:
        """``step`` plus ``prefill_varlen`` of the pieces in the same forward; returns (drawn
        int32 [bucket], one Row per piece)."""

    def compile_mixed(self, bucket: int, token_rows: int) -> float:
        """Compile ``mixed_step`` for (bucket, token_rows) ahead of time; seconds (0.0 if done)."""


class Logprobs(Protocol):
    """``Capability.LOGPROBS``: log-probabilities (``TokenLogprobs``, defined by sampling.py's
    ``token_logprobs``) of drawn tokens and of prompts. The plain ``step`` computes none."""

    def step_logprobs(self, tokens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, TokenLogprobs]:
        """``step`` that also returns the TokenLogprobs ([bucket] rows) of the drawn tokens
        under each slot's logits; only the drawn tokens and these arrays reach the host."""

    def row_logprobs(self, row: Row, token: int) -> TokenLogprobs:
        """TokenLogprobs (N=1) of ``token`` under a prefilled row's logits."""

    def prompt_logprobs(self, tokens: np.ndarray) -> TokenLogprobs:
        """Score a prompt (int [T], T >= 2) from a fresh state: N = T-1 rows, row t for token
        t+1 under the logits after tokens[:t+1]. Touches no slot (like ``prefill``)."""

    def compile_logprobs(self, buckets: Sequence[int]) -> dict[str, float]:
        """Compile ahead of time what ``step_logprobs`` (each of ``buckets``), ``row_logprobs``
        and ``prompt_logprobs`` run; {what: seconds} (0.0 for what was compiled already)."""


class TokenMask(Protocol):
    """``Capability.TOKEN_MASK``: no methods of its own; ``step``, ``step_logprobs`` and
    ``mixed_step`` take a keyword ``allowed`` (int32 [bucket, W] packed masks, or None = no row
    constrained, the unmasked executable) and ``sample`` takes ``allowed`` int32 [W] (or None):
    disallowed tokens get logits -inf before sampling, as banned tokens do. The draws of a
    row whose mask allows everything equal the unmasked draws. ``allowed`` may also be a
    function returning the masks (token_mask.Masks): the engine calls it once per call, after
    starting the model forward where it can (so the host computes masks while the device runs)
    and before sampling."""


class ReportsCompiles(Protocol):
    """``Capability.REPORTS_COMPILES``: compile events, however a call triggered them (lazily
    inside ``prefill``, ``step``, ``resize``... or ahead of time in ``compile*``)."""

    def add_compile_listener(self, listener: Callable[[str, float, float], None]) -> None:
        """Call ``listener(what, start, seconds)`` after every compile, in the thread that
        compiled, before the engine call that needed it returns: ``what`` names the
        executable (e.g. "step:8", "prefill:64"), ``start`` is the time.perf_counter() at
        which the compile began, ``seconds`` its duration."""


class Compiles(Protocol):
    """``Capability.COMPILES``: no methods of its own; the engine compiles an executable per
    shape, so its ``compile``, ``compile_prefill`` (and the capabilities' ``compile_varlen``,
    ``compile_mixed``, ``compile_logprobs``) take real time, and they are safe to call from a
    second thread while another runs ``step``, ``insert``, ``resize``, ``prefill``...: the
    scheduler compiles the buckets it is about to need there (scheduler/ahead.py). What a
    ``compile*`` call returned for is compiled and run once: using it waits for nothing. An
    engine without it (torch's eager model) compiles nothing; its ``compile*`` return at once."""


_PROTOCOLS = {Capability.VARLEN_PREFILL: VarlenPrefill, Capability.MIXED_STEP: MixedStep,
              Capability.LOGPROBS: Logprobs, Capability.REPORTS_COMPILES: ReportsCompiles,
              Capability.TOKEN_MASK: TokenMask, Capability.COMPILES: Compiles}


def check_capabilities(engine) -> None:
    """TypeError, one line naming the engine, when ``engine.capabilities`` is not a frozenset
    of Capability or a declared capability's method is missing."""
    name = type(engine).__name__
    declared = getattr(engine, "capabilities", None)
    if not isinstance(declared, frozenset) or not all(isinstance(c, Capability) for c in declared):
        raise TypeError(f"{name}.capabilities must be a frozenset of Capability members, got {declared!r}")
    for capability in (c for c in Capability if c in declared):
        for method in capability.methods:
            if not callable(getattr(engine, method, None)):
                raise TypeError(f"{name} declares {capability} but has no method {method}()")


def varlen_shape(n_tokens: int, min_tokens: int = 16) -> int:
    """Flat token rows a flattened call of ``n_tokens`` is padded to: the next power of two,
    at least ``min_tokens`` (so engines compile few shapes)."""
    if n_tokens < 1:
        raise ValueError(f"varlen_shape needs n_tokens >= 1, got {n_tokens}")
    return max(min_tokens, 1 << (n_tokens - 1).bit_length())


def host_row_bytes(host_row: HostRow) -> int:
    """Bytes held by a host row."""
    return int(sum(np.asarray(a).nbytes for a in host_row if a is not None))
