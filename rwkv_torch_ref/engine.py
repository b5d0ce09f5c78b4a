"""`TorchEngine`: the engine contract (rwkv7_core/engine.py) on the torch reference.

The batch ("slots") lives on the model's device: the recurrent State [bucket, ...], penalty
counts float32 [bucket, V], banned mask bool [bucket, V] and per-slot sampling parameters
(SamplingRows of [bucket] tensors; seeds held as int64). A step counts the fed tokens, runs
``model.forward`` (T=1) and samples every row with ``rwkv_torch_ref.sampling``. Eager torch:
``compile`` has nothing to build and reports 0 s. Declares ``Capability.LOGPROBS`` (the
scores computed only in the calls that ask for them) and ``Capability.TOKEN_MASK`` (packed
allowed-token masks, unpacked on the device only in the calls given them).
"""
from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np
import torch

from rwkv7_core.engine import Capability, Slots
from rwkv7_core.engine_checks import check_prompt, check_resize, check_slot
from rwkv7_core.sampling import SamplingParams, SamplingRows, TokenLogprobs, banned_mask, sampling_rows
from rwkv7_core.state import check_wkv_dtype
from rwkv7_core.token_mask import Masks, masks_now

from .sampling import disallowed, sample_rows, token_logprobs, update_counts
from .state import State, select_rows


class TorchEngine:
    """Engine protocol implementation for a loaded ``rwkv_torch_ref`` model.

    Rows are ``(State with B=1, logits float32 [V] | None)``; host rows are numpy copies. The
    contract's ``config``, ``dtype``, ``kernels`` and ``device`` are the model's, and so is
    ``state_dtype`` (the wkv state's dtype name); a prompt is prefilled in one call
    (``prefill_pieces`` is empty).
    """
    capabilities = frozenset({Capability.LOGPROBS, Capability.TOKEN_MASK})

    def __init__(self, model):
        self.model = model
        self.config, self.vocab_size = model.config, model.config.vocab_size
        self.dtype, self.kernels = str(model.dtype).removeprefix("torch."), model.kernels.value
        self.state_dtype = str(model.state_dtype).removeprefix("torch.")
        self.device = str(model.device)
        self.prefill_pieces = ()
        self.bucket = 0
        self.last_path = f"torch-{model.kernels.value}"
        self.slots: Slots | None = None

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        """A numpy array on the device (uint32 as int64; ml_dtypes bfloat16 as torch.bfloat16)."""
        a = np.ascontiguousarray(a.astype(np.int64) if a.dtype == np.uint32 else a)
        if a.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(self.device)
        return torch.from_numpy(a).to(self.device)

    def _masks(self, allowed: Masks, rows: int) -> torch.Tensor | None:
        """Packed allowed-token masks (or their function, called now: after the forward) as an
        int32 [rows, W] tensor (None stays None)."""
        allowed = masks_now(allowed)
        return None if allowed is None else self._tensor(np.asarray(allowed, np.int32).reshape(rows, -1))

    def _rows(self, params: Sequence[SamplingParams]) -> SamplingRows:
        return SamplingRows(*(self._tensor(a) for a in sampling_rows(params)))

    def compile(self, buckets: Sequence[int]) -> dict[int, float]:
        return {b: 0.0 for b in buckets}

    def compile_prefill(self) -> dict[int, float]:
        return {}

    @torch.inference_mode()
    def prefill(self, tokens: np.ndarray, start=None):
        tokens = check_prompt(tokens, "prefill").astype(np.int64)
        state = self.model.init_state(1) if start is None else start[0]
        logits, state = self.model.forward(tokens[None], state)
        return state, logits[0]

    @torch.inference_mode()
    def sample(self, row, params: SamplingParams, position: int = 0, allowed: np.ndarray | None = None) -> int:
        logits = row[1][None]
        banned = disallowed(self._tensor(banned_mask([params], self.vocab_size)), self._masks(allowed, 1))
        positions = torch.tensor([position], device=self.device)
        return int(sample_rows(logits, torch.zeros_like(logits), self._rows([params]), banned, positions)[0])

    @torch.inference_mode()
    def insert(self, slot: int, row, params: SamplingParams) -> None:
        check_slot(slot, self.bucket)
        for leaf, part in zip(self.slots.state, row[0]):
            leaf[slot] = part[0].to(leaf.dtype)
        self.slots.counts[slot] = 0
        self.slots.banned[slot] = self._tensor(banned_mask([params], self.vocab_size))[0]
        for leaf, part in zip(self.slots.rows, self._rows([params])):
            leaf[slot] = part[0]

    @torch.inference_mode()
    def extract(self, slot: int):
        check_slot(slot, self.bucket)
        return select_rows(self.slots.state, [slot]), None

    @torch.inference_mode()
    def resize(self, keep_slots: Sequence[int], new_bucket: int) -> None:
        keep = check_resize(keep_slots, self.bucket, new_bucket)
        if self.slots is None or not keep:
            V = self.vocab_size
            self.slots = Slots(self.model.init_state(new_bucket),
                               torch.zeros((new_bucket, V), dtype=torch.float32, device=self.device),
                               torch.zeros((new_bucket, V), dtype=torch.bool, device=self.device),
                               self._rows([SamplingParams()] * new_bucket))
        else:
            index = torch.tensor(keep + [0] * (new_bucket - len(keep)), device=self.device)
            self.slots = Slots(select_rows(self.slots.state, index), self.slots.counts[index].clone(),
                               self.slots.banned[index].clone(),
                               SamplingRows(*(leaf[index].clone() for leaf in self.slots.rows)))
        self.bucket = new_bucket

    @torch.inference_mode()
    def step(self, tokens: np.ndarray, positions: np.ndarray, allowed: Masks = None) -> np.ndarray:
        return self._step(tokens, positions, with_logprobs=False, allowed=allowed)[0]

    def _step(self, tokens: np.ndarray, positions: np.ndarray, with_logprobs: bool, allowed: Masks):
        tokens = torch.from_numpy(np.asarray(tokens, np.int64)).to(self.device)
        positions = torch.from_numpy(np.asarray(positions, np.int64)).to(self.device)
        slots = self.slots
        counts = update_counts(slots.counts, tokens, slots.rows.decay)
        logits, state = self.model.forward(tokens[:, None], slots.state)
        drawn = sample_rows(logits, counts, slots.rows, disallowed(slots.banned, self._masks(allowed, len(tokens))),
                            positions)
        self.slots = slots._replace(state=state, counts=counts)
        return drawn.cpu().numpy(), token_logprobs(logits, drawn) if with_logprobs else None

    # -- Capability.LOGPROBS ---------------------------------------------------------------
    def compile_logprobs(self, buckets: Sequence[int]) -> dict[str, float]:
        return {}

    @torch.inference_mode()
    def step_logprobs(self, tokens: np.ndarray, positions: np.ndarray,
                      allowed: np.ndarray | None = None) -> tuple[np.ndarray, TokenLogprobs]:
        return self._step(tokens, positions, with_logprobs=True, allowed=allowed)

    @torch.inference_mode()
    def row_logprobs(self, row, token: int) -> TokenLogprobs:
        return token_logprobs(row[1][None], torch.tensor([token], device=self.device))

    @torch.inference_mode()
    def prompt_logprobs(self, tokens: np.ndarray) -> TokenLogprobs:
        tokens = check_prompt(tokens, "prompt_logprobs", min_tokens=2).astype(np.int64)
        logits, _ = self.model.forward(tokens[None], self.model.init_state(1), full_output=True)
        return token_logprobs(logits[0, :-1], torch.from_numpy(tokens[1:]).to(self.device))

    def to_host(self, row):
        """numpy copies; bfloat16 shifts (numpy has none) widen to float32, losslessly; a bfloat16
        wkv leaf stays bfloat16 (``ml_dtypes``: half the bytes of a kept state, as in JaxEngine)."""
        (att, wkv, ffn), logits = row
        def host(t):
            return (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy()
        wkv = (wkv.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16) if wkv.dtype == torch.bfloat16
               else host(wkv))
        return (host(att), wkv, host(ffn)) + (None if logits is None else host(logits),)

    def from_host(self, host_row):
        """Inverse of ``to_host`` (bfloat16 shifts widened to float32 load too); a wkv leaf in
        another state dtype is refused (``StateDtypeError``)."""
        *state, logits = host_row
        check_wkv_dtype(np.asarray(state[1]).dtype, self.state_dtype, "host row")
        dtypes = [leaf.dtype for leaf in self.model.init_state(1)]
        state = State(*(self._tensor(a).to(dt) for a, dt in zip(state, dtypes)))
        return state, (None if logits is None else self._tensor(logits))
