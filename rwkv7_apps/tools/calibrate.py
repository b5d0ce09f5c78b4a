"""Calibrated int8 / int4 weights for ``rwkv7-convert --calibration FILE``.

The float32 torch reference (``rwkv_torch_ref``) runs the calibration tokens as one sequence
and records what each quantized projection receives (``rwkv_torch_ref.calibration``); then
- ``gptq`` (``rwkv7_core.gptq``) rounds each projection with its inputs' Gram matrix, a few
  projections at a time so that their Gram matrices stay within ``GRAM_BUDGET_BYTES`` (one
  pass of the text per batch);
- ``search`` (``rwkv7_core.quantization.search_scales``) picks each group's scale by its
  inputs' mean squares (one pass).
Either writes the layout of a round-to-nearest checkpoint, so the result loads as any
quantized checkpoint.

The calibration file: UTF-8 text for a model with the World vocabulary (65,536 tokens,
encoded with its tokenizer); for another vocabulary, token ids separated by whitespace.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from rwkv7_core.gptq import quantize_gptq
from rwkv7_core.quantization import QuantizationError, QuantSpec, quantize_tensors, quantized_key, scale_key
from rwkv7_core.tokenizer import tokenizer_for

METHODS = ("gptq", "search")
DEFAULT_TOKENS = 4096
MIN_TOKENS = 64
GRAM_BUDGET_BYTES = 1 << 30  # float64 Gram matrices recorded per pass of the calibration text


class CalibrationError(QuantizationError):
    """A calibration file that cannot be used (one line, naming the file)."""


def calibration_tokens(path: str | Path, vocab_size: int, model_path: str | Path, limit: int) -> np.ndarray:
    """The first `limit` tokens (int64 [T], MIN_TOKENS <= T <= limit) of the calibration file
    (module doc); CalibrationError naming the file when it is unreadable, too short or holds
    an id outside the vocabulary."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CalibrationError(f"calibration file {str(path)!r}: {e}") from None
    tokenizer = tokenizer_for(vocab_size, model_path)
    if tokenizer is not None:
        ids = np.asarray(tokenizer.encode(text)[:limit], np.int64)
    else:
        words = text.split()[:limit]
        bad = next((i for i, word in enumerate(words) if not word.isdigit() or int(word) >= vocab_size), None)
        if bad is not None:
            raise CalibrationError(f"calibration file {str(path)!r}: word {bad} ({words[bad][:20]!r}) is not a token "
                                   f"id below {vocab_size} (a model without the World vocabulary takes token ids)")
        ids = np.asarray([int(word) for word in words], np.int64)
    if len(ids) < MIN_TOKENS:
        raise CalibrationError(f"calibration file {str(path)!r}: {len(ids)} tokens, fewer than the {MIN_TOKENS} "
                               f"calibration needs")
    return ids


def gram_batches(tensors: Mapping[str, np.ndarray], budget: int = GRAM_BUDGET_BYTES) -> Iterator[list[str]]:
    """The quantized projections' keys in batches whose Gram matrices (in² float64 each) fit
    in `budget` bytes (a projection larger than the budget goes alone)."""
    batch: list[str] = []
    used = 0
    for key in tensors:
        if not quantized_key(key):
            continue
        size = 8 * tensors[key].shape[1] ** 2
        if batch and used + size > budget:
            yield batch
            batch, used = [], 0
        batch.append(key)
        used += size
    if batch:
        yield batch


def calibrated_tensors(model_path: str | Path, tensors: Mapping[str, np.ndarray], spec: QuantSpec,
                       tokens: np.ndarray, method: str) -> dict[str, np.ndarray]:
    """`tensors` (a whole float checkpoint, e.g. cast to its output dtype) with the quantized
    projections as q and scales, calibrated by `method` (module doc) on `tokens` run through
    the float32 model at `model_path`."""
    if method not in METHODS:
        raise CalibrationError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    try:  # torch is an optional dependency: rwkv7-convert without --calibration runs without it
        import rwkv_torch_ref
        from rwkv_torch_ref.calibration import input_gram, input_power
    except ModuleNotFoundError as e:
        raise CalibrationError(f"--calibration runs the torch reference, which needs {e.name} "
                               f"(pip install 'rwkv7-engine[torch]')") from None
    model = rwkv_torch_ref.load(model_path)
    if method == "search":
        return quantize_tensors(tensors, spec, input_power(model, tokens))
    rounded: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for batch in gram_batches(tensors):
        grams = input_gram(model, tokens, batch)
        for key in batch:
            rounded[key] = quantize_gptq(tensors[key], spec, grams.pop(key), key)
    out: dict[str, np.ndarray] = {}
    for key in tensors:
        if key in rounded:
            out[key], out[scale_key(key)] = rounded[key]
        else:
            out[key] = tensors[key]
    return out
