"""Hugging Face RWKV-7 model directories (``RWKV7ForCausalLM``, fla's layout), read and written.

A directory holds ``config.json`` (``model_type`` ``rwkv7``, or ``rwkv7_fla`` of older fla
releases; fla's ``RWKV7Config`` keys), the weights as ``model.safetensors`` or as the shards
that ``model.safetensors.index.json`` names, and optionally the World tokenizer's vocabulary
(``VOCAB_FILE``). Tensor names and layouts: ``hf_names``. Reading gives our official layout as
``LazyTensors`` (each tensor read from its shard on access); the model's shape comes from
config.json (``hf_config``: every size bounded before use) and is cross-checked against every
tensor shape. Every file read is confined to the directory (``confined``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from functools import partial
from pathlib import Path
from typing import Mapping

import numpy as np

from .config import ModelConfig, expected_shapes
from .confined import confined_file
from .hf_config import hf_config, read_hf_config
from .hf_names import Source, fla_source, unused_in_fla, variant_sources
from .tensor_files import (
    FLOATS,
    SUPPORTED_DTYPES,
    CheckpointError,
    Entry,
    LazyTensors,
    safetensors_entries,
    write_safetensors,
)
from .tokenizer import VOCAB_FILE

INDEX = "model.safetensors.index.json"


# ----------------------------------------------------------------------------- reading
def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a model directory (the index's shards, or model.safetensors),
    each confined to it (``confined.confined_file``); CheckpointError naming what is missing."""
    if confined_file(directory, INDEX) is not None:
        index = directory / INDEX
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{str(index)!r}: malformed index ({type(e).__name__}: {e})") from None
        for shard in shards:
            if confined_file(directory, shard) is None:
                raise CheckpointError(f"{str(index)!r} names the shard {_short(shard)}, which is not a file "
                                      f"inside {str(directory)!r}")
        return [directory / s for s in shards]
    if confined_file(directory, "model.safetensors") is not None:
        return [directory / "model.safetensors"]
    others = sorted(p.name for p in directory.iterdir() if p.suffix in (".bin", ".pth", ".pt", ".gguf"))
    raise CheckpointError(f"{str(directory)!r} holds no weights: neither model.safetensors nor {INDEX}"
                          + (f" (found {', '.join(others)}: only safetensors are read)" if others else ""))


def _short(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


def read_hf_dir(directory: str | os.PathLike) -> LazyTensors:
    """Our official layout of an HF model directory, each tensor read on access. Every
    config.json size is checked against the tensors (CheckpointError naming the key and both
    shapes); a tensor the mapping does not use is an error too."""
    directory = Path(directory)
    config = read_hf_config(directory)
    found: dict[str, Entry] = {}
    for shard in weight_files(directory):
        found.update(safetensors_entries(shard)[0])
    _check_layers(directory, config, found)
    entries, used = {}, set()
    for key, shape in expected_shapes(config).items():
        source = _pick(key, found)
        if source is None:
            if unused_in_fla(key):
                dtype = found["model.embeddings.weight"].dtype
                entries[key] = Entry(shape, dtype, partial(np.zeros, shape, dtype))
                continue
            raise CheckpointError(f"{str(directory)!r}: missing tensor {fla_source(key).name!r} (our {key!r})")
        used.add(source.name)
        src = found[source.name]
        if src.dtype not in FLOATS:
            raise CheckpointError(f"{str(directory)!r}: tensor {source.name!r} has dtype {src.dtype} (expected one "
                                  f"of {', '.join(SUPPORTED_DTYPES)})")
        if src.shape not in _source_shapes(source, shape):
            raise CheckpointError(f"{str(directory)!r}: tensor {source.name!r} has shape {src.shape}, but "
                                  f"config.json gives {_source_shapes(source, shape)[0]} ({_describe(config)})")
        entries[key] = Entry(shape, src.dtype, _reader(src, source, shape))
    extra = sorted(set(found) - used)
    if extra:
        raise CheckpointError(f"{str(directory)!r}: unexpected tensor {extra[0]!r} with shape {found[extra[0]].shape}"
                              + (f" and {len(extra) - 1} more" if len(extra) > 1 else ""))
    return LazyTensors(entries, str(directory))


def _check_layers(directory: Path, config: ModelConfig, found: Mapping[str, Entry]) -> None:
    """config.json's sizes against the tensors that carry them, naming key and shapes."""
    layers = {int(m.group(1)) for k in found if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    if len(layers) != config.n_layer or min(layers, default=0) != 0 or max(layers, default=-1) != config.n_layer - 1:
        raise CheckpointError(f"{str(directory)!r}: config.json num_hidden_layers={config.n_layer}, but the "
                              f"tensors hold layers {min(layers, default=None)}..{max(layers, default=None)}")
    probes = (("vocab_size", "model.embeddings.weight", 0, config.vocab_size),
              ("hidden_size", "model.embeddings.weight", 1, config.n_embd),
              ("intermediate_size", "model.layers.0.ffn.key.weight", 0, config.dim_ffn),
              ("num_heads", "model.layers.0.attn.r_k", 0, config.n_head),
              ("head_dim", "model.layers.0.attn.r_k", 1, config.head_size),
              ("decay_low_rank_dim", "model.layers.0.attn.w_lora.lora.0.weight", 0, config.d_decay),
              ("a_low_rank_dim", "model.layers.0.attn.a_lora.lora.0.weight", 0, config.d_aaa),
              ("v_low_rank_dim", f"model.layers.{min(1, config.n_layer - 1)}.attn.v_lora.lora.0.weight", 0,
               config.d_mv),
              ("gate_low_rank_dim", "model.layers.0.attn.g_lora.lora.0.weight", 0, config.d_gate))
    for key, name, axis, value in probes:
        shape = found[name].shape if name in found else None
        if shape is not None and (len(shape) <= axis or shape[axis] != value):
            raise CheckpointError(f"{str(directory)!r}: config.json {key}={value}, but tensor {name!r} has shape "
                                  f"{shape} (axis {axis} is {key})")


def _describe(c: ModelConfig) -> str:
    return (f"hidden_size={c.n_embd}, num_heads={c.n_head}, head_dim={c.head_size}, vocab_size={c.vocab_size}, "
            f"intermediate_size={c.dim_ffn}, decay/a/v/gate_low_rank_dim={c.d_decay}/{c.d_aaa}/{c.d_mv}/{c.d_gate}")


def _pick(key: str, found: Mapping[str, Entry]) -> Source | None:
    return next((s for s in [fla_source(key)] + variant_sources(key) if s.name in found), None)


def _source_shapes(source: Source, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The shapes the source tensor may have for our ``shape`` (the first is fla's)."""
    if source.how == "transpose":
        return [shape[::-1]]
    if source.how == "reshape":
        return [(shape[-1],), shape]
    if source.how == "row":
        return [(6, shape[-1])]
    return [shape]


def _reader(src: Entry, source: Source, shape: tuple[int, ...]):
    def read() -> np.ndarray:
        a = src.read()
        if source.how == "transpose":
            return np.ascontiguousarray(a.T)
        if source.how == "row":
            return a[source.row].reshape(shape).copy()
        return a.reshape(shape)
    return read


# ----------------------------------------------------------------------------- writing
def write_hf_dir(directory: str | os.PathLike, tensors: Mapping[str, np.ndarray], config: ModelConfig,
                 dtype: str, max_shard_bytes: int | None = None, vocab_file: str | os.PathLike | None = None) -> list[Path]:
    """Write our-layout ``tensors`` (any float dtype, cast to ``dtype``) as an HF model
    directory fla's and rwkv7-hf's loaders read: config.json, model.safetensors (or shards of
    at most ``max_shard_bytes`` and their index; tensors are read and written one shard at a
    time), and ``vocab_file`` copied as ``VOCAB_FILE``. Returns the weight files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = np.dtype(SUPPORTED_DTYPES[dtype])
    plan: list[list[tuple[str, str]]] = [[]]
    size = total = 0
    for key, shape in expected_shapes(config).items():
        if unused_in_fla(key):
            continue
        nbytes = int(np.prod(_source_shapes(fla_source(key), shape)[0])) * target.itemsize
        if max_shard_bytes and plan[-1] and size + nbytes > max_shard_bytes:
            plan.append([])
            size = 0
        plan[-1].append((key, fla_source(key).name))
        size += nbytes
        total += nbytes
    names = (["model.safetensors"] if len(plan) == 1 else
             [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))])
    for name, shard in zip(names, plan):
        write_safetensors(directory / name, {hf: _to_fla(key, tensors[key]).astype(target, copy=False)
                                             for key, hf in shard}, {"format": "pt"})
    if len(plan) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {hf: name for name, shard in zip(names, plan) for _, hf in shard}}
        (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    (directory / "config.json").write_text(json.dumps(hf_config(config, dtype), indent=2) + "\n")
    if vocab_file is not None:
        shutil.copyfile(vocab_file, directory / VOCAB_FILE)
    return [directory / n for n in names]


def _to_fla(key: str, a: np.ndarray) -> np.ndarray:
    source = fla_source(key)
    if source.how == "transpose":
        return np.ascontiguousarray(a.T)
    return a.reshape(_source_shapes(source, tuple(a.shape))[0])
