"""Weight-only quantization of the large projections, numpy only (one definition for both
frameworks).

Schemes (``SCHEMES``):
- ``none``: weights as loaded.
- ``int8``: symmetric int8, one float32 scale per output channel and group of ``group_size``
  consecutive input channels: scale = max|w| / 127 over the group, q = round(w / scale).
- ``int4``: symmetric 4-bit, groups as int8: scale = max|w| / 7 over the group,
  q = round(w / scale) in [-7, 7], two values a byte (``pack_int4``).
- ``fp8``: float8_e4m3fn, one float32 scale per output channel: scale = max|w| / 448 over the
  row, q = e4m3(w / scale) (round to nearest).

A weight ``w [out, in]`` quantizes to ``(q [out, in], scale float32 [out, in / G])``
(G = group_size for int8 and int4, G = in for fp8; int4's q is held packed, uint8
[out, in / 2]) and dequantizes as ``q * scale`` repeated over each group.

The int4 packing: within each group of G input channels, byte j (0 <= j < G / 2) of the
group's G / 2 bytes holds channel j in its low nibble and channel j + G / 2 in its high
nibble, each a 4-bit two's-complement value. So a contiguous run of bytes inside a group
unpacks to two contiguous runs of channels (a kernel tile multiplies each by a contiguous
slice of the input), and the group size is implied by the shapes (2 * bytes / scales).

Scale search (int8 / int4, optional): given each input channel's importance (its mean square
on a calibration text, ``rwkv_torch_ref.calibration``), a group's scale is the candidate
among ``SEARCH_RATIOS`` x max|w| / qmax with the least importance-weighted squared error
(activation-aware clipping, as AWQ's clip search). It changes only the scale values: the
stored layout and the products are the same.

Quantized: the time-mix receptance/key/value/output, the channel-mix key/value and the
head (``quantized_key``); the embedding (a gather of B rows per step), the LoRA matrices,
LayerNorm and mixing vectors stay as they are. A quantized checkpoint stores q under the
weight's key, its scale under ``scale_key(key)``, and the scheme and group size in the
safetensors metadata (``metadata`` / ``stored_spec``).
"""
from __future__ import annotations

import re
from typing import Mapping, NamedTuple

import ml_dtypes
import numpy as np

from .tensor_files import CheckpointError

SCHEMES = ("none", "int8", "int4", "fp8")
GROUPED = ("int8", "int4")  # schemes with a group size
# int8 and int4 groups: int8's chosen by benchmarks/quant_accuracy.py; int4's by the 1.5b decode
# step's bytes (benchmarks/quant_decode_kernels.py: 0.310x bf16's at 128, 0.327x at 64), 64 being
# the more accurate (docs/models.md)
DEFAULT_GROUP_SIZE = 128
STORAGE_DTYPES = {"int8": np.dtype(np.int8), "int4": np.dtype(np.uint8), "fp8": np.dtype(ml_dtypes.float8_e4m3fn)}
QMAX = {"int8": 127.0, "int4": 7.0, "fp8": float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)}  # 448
METADATA_SCHEME, METADATA_GROUP = "rwkv7_quantization", "rwkv7_quantization_group_size"
SCALE_SUFFIX = "_scale"
SEARCH_RATIOS = tuple(1.0 - 0.04 * i for i in range(13))  # scale candidates x the RTN scale (1 .. 0.52)
SEARCH_ROWS = 4096  # rows per slice of the scale search
_QUANTIZED = re.compile(r"head\.weight|blocks\.\d+\.(att\.(receptance|key|value|output)|ffn\.(key|value))\.weight")


class QuantizationError(CheckpointError):
    """A quantization request or a quantized checkpoint that cannot be used (one line, naming
    the tensor where there is one)."""


class QuantSpec(NamedTuple):
    """A scheme (``int8`` | ``int4`` | ``fp8``) and the group size (fp8: one scale per row, G = 0)."""

    scheme: str
    group_size: int = 0

    def group(self, width: int) -> int:
        """Input channels per scale for a weight of `width` input channels."""
        return self.group_size if self.scheme in GROUPED else width

    def describe(self) -> str:
        return f"{self.scheme} (groups of {self.group_size})" if self.scheme in GROUPED else self.scheme


def spec_for(scheme: str, group_size: int | None = None) -> QuantSpec | None:
    """The QuantSpec of a scheme name (None for ``none``); QuantizationError for an unknown
    scheme, a group size with a scheme other than int8 / int4, or a group size that is not a
    positive multiple of 16."""
    if scheme not in SCHEMES:
        raise QuantizationError(f"unknown quantization {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if group_size is not None and scheme not in GROUPED:
        raise QuantizationError(f"quantization group size {group_size} applies to int8 and int4 only "
                                f"(quantization {scheme})")
    if scheme == "none":
        return None
    if scheme == "fp8":
        return QuantSpec("fp8")
    group = DEFAULT_GROUP_SIZE if group_size is None else group_size
    if not isinstance(group, int) or group < 16 or group % 16:
        raise QuantizationError(f"quantization group size {group!r}: expected a positive multiple of 16")
    return QuantSpec(scheme, group)


def quantized_key(key: str) -> bool:
    """Whether the checkpoint tensor `key` is one of the quantized projections."""
    return _QUANTIZED.fullmatch(key) is not None


def scale_key(key: str) -> str:
    """The checkpoint key of a quantized weight's scales."""
    return key + SCALE_SUFFIX


def scale_shape(spec: QuantSpec, shape: tuple[int, int]) -> tuple[int, int]:
    """Scale shape [out, in / G] of a quantized weight of shape [out, in]."""
    out, width = shape
    return out, width // spec.group(width)


def stored_shape(spec: QuantSpec, shape: tuple[int, int]) -> tuple[int, int]:
    """Shape of the stored q of a weight of shape [out, in]: [out, in / 2] for int4 (packed)."""
    out, width = shape
    return (out, width // 2) if spec.scheme == "int4" else (out, width)


def pack_int4(q: np.ndarray, group: int) -> np.ndarray:
    """int8 [out, in] of values in [-8, 7] -> uint8 [out, in / 2] (the module doc's layout)."""
    out, width = q.shape
    halves = (q.reshape(out, width // group, 2, group // 2).astype(np.uint8) & 0xF)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(out, width // 2)


def unpack_int4(packed: np.ndarray, group: int) -> np.ndarray:
    """uint8 [out, in / 2] -> int8 [out, in] (inverse of ``pack_int4``)."""
    out, half = packed.shape
    b = packed.astype(np.int16).reshape(out, 2 * half // group, 1, group // 2)
    nibbles = np.concatenate([b & 0xF, b >> 4], axis=2)
    return ((nibbles ^ 8) - 8).astype(np.int8).reshape(out, 2 * half)


def check_width(spec: QuantSpec, key: str, shape: tuple[int, ...]) -> None:
    """QuantizationError naming `key` unless it is a matrix whose width the group divides."""
    if len(shape) != 2:
        raise QuantizationError(f"key {key!r}: cannot quantize a tensor of shape {tuple(shape)} (expected [out, in])")
    if shape[1] % spec.group(shape[1]):
        raise QuantizationError(f"key {key!r}: quantization group size {spec.group_size} does not divide "
                                f"its width {shape[1]} (shape {tuple(shape)})")


def quantize(w: np.ndarray, spec: QuantSpec, key: str = "weight",
             importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """w [out, in] (any float dtype) -> (q [out, in] int8 | float8_e4m3fn, or uint8 [out, in / 2]
    packed int4; scale float32 [out, in / G]). With `importance` (float [in] >= 0, e.g. each
    input channel's mean square on a calibration text; int8 / int4 only) each group's scale is
    searched (``search_scales``) instead of max|w| / qmax."""
    check_width(spec, key, w.shape)
    out, width = w.shape
    g = spec.group(width)
    groups = np.asarray(w, np.float32).reshape(out, width // g, g)
    absmax = np.abs(groups).max(axis=-1)
    scale = np.where(absmax > 0, absmax / QMAX[spec.scheme], 1.0).astype(np.float32)
    if importance is not None:
        if spec.scheme not in GROUPED or np.shape(importance) != (width,):
            raise QuantizationError(f"key {key!r}: a scale search needs int8 / int4 and importance of shape "
                                    f"({width},), got {spec.scheme} and {np.shape(importance)}")
        scale = search_scales(groups, scale, np.asarray(importance, np.float64).reshape(width // g, g),
                              QMAX[spec.scheme])
    scaled = groups / scale[..., None]
    if spec.scheme in GROUPED:
        qmax = QMAX[spec.scheme]
        q = np.clip(np.rint(scaled), -qmax, qmax).astype(np.int8)
        if spec.scheme == "int4":
            return pack_int4(q.reshape(out, width), g), scale
    else:
        q = np.clip(scaled, -QMAX["fp8"], QMAX["fp8"]).astype(ml_dtypes.float8_e4m3fn)
    return q.reshape(out, width), scale


def search_scales(groups: np.ndarray, scale: np.ndarray, importance: np.ndarray, qmax: float) -> np.ndarray:
    """The activation-aware scale search: groups float32 [out, n, G], their round-to-nearest
    scales [out, n] (max|w| / qmax), importance [n, G] -> scales [out, n]: for each group the
    scale among ``SEARCH_RATIOS`` x the RTN one (clipping the largest weights) with the least
    importance-weighted squared error sum_j importance_j (w_j - q_j * scale)^2 (RTN's ratio 1
    is a candidate, so no group does worse on that measure). Rows go in slices (memory)."""
    best = scale.copy()
    for start in range(0, groups.shape[0], SEARCH_ROWS):
        part, base = groups[start:start + SEARCH_ROWS], scale[start:start + SEARCH_ROWS]
        least = np.full(base.shape, np.inf)
        for ratio in SEARCH_RATIOS:
            s = (base * np.float32(ratio))[..., None]
            err = ((np.clip(np.rint(part / s), -qmax, qmax) * s - part) ** 2 * importance).sum(-1)
            better = err < least
            least = np.where(better, err, least)
            rows = slice(start, start + SEARCH_ROWS)
            best[rows] = np.where(better, base * np.float32(ratio), best[rows])
    return best


def dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(q [out, in] (int4: packed uint8 [out, in / 2]), scale [out, in / G]) -> float32
    [out, in]: each group of q times its scale."""
    groups = scale.shape[1]
    if q.dtype == STORAGE_DTYPES["int4"]:
        q = unpack_int4(q, 2 * q.shape[1] // groups)
    out, width = q.shape
    return (q.astype(np.float32).reshape(out, groups, width // groups) * scale[..., None]).reshape(out, width)


def metadata(spec: QuantSpec) -> dict[str, str]:
    """The safetensors metadata recording `spec`."""
    return {METADATA_SCHEME: spec.scheme, METADATA_GROUP: str(spec.group_size)}


def stored_spec(meta: Mapping[str, str], source: str = "checkpoint") -> QuantSpec | None:
    """The QuantSpec a checkpoint's metadata records (None for a plain checkpoint)."""
    scheme = meta.get(METADATA_SCHEME)
    if scheme is None:
        return None
    if scheme not in STORAGE_DTYPES:
        raise QuantizationError(f"{source!r}: metadata {METADATA_SCHEME}={scheme!r} is not a quantization "
                                f"scheme ({', '.join(STORAGE_DTYPES)})")
    try:
        group = int(meta.get(METADATA_GROUP, "0"))
    except ValueError:
        raise QuantizationError(f"{source!r}: metadata {METADATA_GROUP}={meta[METADATA_GROUP]!r} is not an integer") from None
    return spec_for(scheme, group) if scheme in GROUPED else QuantSpec("fp8")


def resolve_spec(requested: str, group_size: int | None, stored: QuantSpec | None,
                 source: str = "checkpoint") -> QuantSpec | None:
    """The QuantSpec to load with: the requested one for a plain checkpoint; a quantized
    checkpoint loads only with its own scheme (and group size, when one is given)."""
    spec = spec_for(requested, group_size)
    if stored is None:
        return spec
    if spec is None or spec.scheme != stored.scheme or (group_size is not None and spec != stored):
        asked = "none" if spec is None else spec.describe()
        raise QuantizationError(f"{source!r} holds {stored.describe()} weights but quantization {asked} was "
                                f"requested; load it with quantization={stored.scheme!r}")
    return stored


def check_quantized(tensors, spec: QuantSpec, key: str, shape: tuple[int, int], source: str = "checkpoint") -> None:
    """QuantizationError naming the tensor unless a quantized checkpoint holds `key`, a weight
    of logical `shape`, as q of ``stored_shape`` in the scheme's dtype and its scales of the
    matching shape. `tensors` has ``shape(key)`` / ``dtype(key)`` (LazyTensors)."""
    if tensors.dtype(key) != STORAGE_DTYPES[spec.scheme]:
        raise QuantizationError(f"{source!r}, key {key!r}: dtype {tensors.dtype(key)} in a {spec.scheme} "
                                f"checkpoint (expected {STORAGE_DTYPES[spec.scheme]})")
    check_width(spec, key, shape)
    if tuple(tensors.shape(key)) != stored_shape(spec, shape):
        raise QuantizationError(f"{source!r}, key {key!r}: expected {spec.scheme} q of shape "
                                f"{stored_shape(spec, shape)}, got {tuple(tensors.shape(key))}")
    skey, want = scale_key(key), scale_shape(spec, shape)
    if skey not in tensors:
        raise QuantizationError(f"{source!r}, key {key!r}: its scales {skey!r} are missing")
    if tuple(tensors.shape(skey)) != want or tensors.dtype(skey) != np.float32:
        raise QuantizationError(f"{source!r}, key {skey!r}: expected float32 scales of shape {want}, got "
                                f"{tensors.dtype(skey)} {tuple(tensors.shape(skey))}")


def quantize_tensors(tensors: Mapping[str, np.ndarray], spec: QuantSpec,
                     importance: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A whole checkpoint with its quantized projections as q and scales (the layout of a
    quantized checkpoint); other tensors unchanged. importance: per projection key its
    input channels' importance for the scale search (``quantize``; e.g.
    ``rwkv_torch_ref.calibration.input_power``), None for round-to-nearest."""
    out = {}
    for key in tensors:
        if quantized_key(key):
            out[key], out[scale_key(key)] = quantize(tensors[key], spec, key,
                                                     None if importance is None else importance[key])
        else:
            out[key] = tensors[key]
    return out
