"""Sequence states for ``rwkv7-generate``: named initial states (``--state NAME=FILE``), the
final states of requests (``--save-states DIR``) and the model fingerprint of the
persistent prefix cache (``--prefix-cache-dir``)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from rwkv7_core.config import ModelConfig
from rwkv7_core.state_files import from_host_row, load_state, save_state, to_host_row
from scheduler.request import InitialState

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_PLAIN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


class NamedState(NamedTuple):
    """A registered initial state: the scheduler's InitialState and the tokens it has consumed."""
    initial: Any
    tokens: int


def state_option(text: str) -> tuple[str, str]:
    """argparse type of ``--state NAME=FILE``."""
    name, sep, path = text.partition("=")
    if not sep or not path or not _NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(f"expected NAME=FILE (NAME: letters, digits, '_', '.', '-'), got {text!r}")
    return name, path


def register_states(specs: list[tuple[str, str]], config: ModelConfig,
                    state_dtype: str = "float32") -> dict[str, NamedState]:
    """{name: NamedState} of the ``--state`` options for a model holding its state in
    ``state_dtype``; StateFileError (naming the file) for an unusable file or one of another
    state dtype, ValueError for a name given twice."""
    states: dict[str, NamedState] = {}
    for name, path in specs:
        if name in states:
            raise ValueError(f"--state {name}= is given twice")
        state = load_state(path, config, state_dtype)
        states[name] = NamedState(InitialState.of(to_host_row(state)), state.tokens)
    return states


def state_file_name(request_id: str | int) -> str:
    """A safe file name for any request id: the id itself when it is a plain name (letters,
    digits, '_', '.', '-', at most 100 characters, not starting with '.' or '-'), else its
    plain characters plus '-' and 12 hex digits of the id's SHA-256 (so names never clash)."""
    text = str(request_id)
    if _PLAIN_ID.fullmatch(text):
        return f"{text}.safetensors"
    plain = re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:64].lstrip(".-")
    digest = hashlib.sha256(json.dumps(request_id).encode()).hexdigest()[:12]
    return f"{plain}-{digest}.safetensors" if plain else f"id-{digest}.safetensors"


def save_final_state(directory: str | os.PathLike, request_id: str | int, host_row: tuple, tokens: int,
                     config: ModelConfig, dtype: str) -> Path:
    """Write a request's final state (an engine host row that has consumed ``tokens`` tokens
    since the zero state) as DIRECTORY/<safe id>.safetensors, atomically; returns the path."""
    path = Path(directory) / state_file_name(request_id)
    save_state(path, from_host_row(host_row, tokens, dtype), config)
    return path


# ----------------------------------------------------------------------------- fingerprint
def model_fingerprint(model_path: str | os.PathLike, backend: str, engine, dtype: str, cache_dir: Path,
                      quantization: str = "none", group_size: int | None = None,
                      state_dtype: str = "float32") -> str:
    """Names what produced the cached rows: the checkpoint's SHA-256 (memoized in
    ``cache_dir`` per file identity, so reruns do not rehash), the dtype, the weight
    quantization (and int8 group size when one was asked for), the state dtype (when not
    float32: a cache entry of another state dtype is never found), the backend, its resolved
    kernels and device."""
    if backend == "jax":
        import jax  # lazy: rwkv7-generate --help (which imports this module) runs without jax

        device = jax.devices()[0].device_kind
    else:
        device = engine.device
    return json.dumps({"checkpoint_sha256": checkpoint_digest(model_path, cache_dir), "dtype": dtype,
                       **({"quantization": quantization} if quantization != "none" else {}),
                       **({"quantization_group_size": group_size} if group_size is not None else {}),
                       **({"state_dtype": state_dtype} if state_dtype != "float32" else {}),
                       "backend": backend, "kernels": engine.kernels, "device": device})


def checkpoint_digest(path: str | os.PathLike, cache_dir: Path) -> str:
    """SHA-256 of a file's bytes (of a model directory: of its .json and .safetensors files,
    names included), memoized under ``cache_dir/checkpoint-digests`` by (real path, device,
    inode, size, mtime) of each file so that an unchanged checkpoint is hashed once."""
    files = (sorted(p for p in Path(path).iterdir() if p.suffix in (".json", ".safetensors"))
             if Path(path).is_dir() else [Path(path)])
    identity = json.dumps([[os.path.realpath(f), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
                           for f in files for st in [os.stat(f)]])
    memo = Path(cache_dir) / "checkpoint-digests" / hashlib.sha256(identity.encode()).hexdigest()
    try:
        value = memo.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{64}", value):
            return value
    except OSError:
        pass
    digest = hashlib.sha256()
    for file in files:
        if len(files) > 1:
            digest.update(file.name.encode() + b"\0")
        with open(file, "rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
    value = digest.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{memo.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(value)
    os.replace(tmp, memo)
    return value


class RunStates:
    """A run's state options: the registered initial states (``named``) and the directory the
    final states go to (``save_dir``, None = not saved)."""

    def __init__(self, named: dict[str, NamedState], save_dir: str | None, config: ModelConfig, dtype: str):
        self.named, self.save_dir, self.config, self.dtype = named, save_dir, config, dtype

    def initial(self, name: str | None):
        """The InitialState registered as ``name`` (None for None); ValueError if unknown."""
        if name is None:
            return None
        if name not in self.named:
            known = ", ".join(sorted(self.named)) or "none; register one with --state NAME=FILE"
            raise ValueError(f"unknown state {name!r} (registered: {known})")
        return self.named[name].initial

    def save(self, request_id: str | int, state_name: str | None, out) -> Path:
        """Write a finished request's ``out.final_state``; its token count adds the initial
        state's, the prompt's and the output's."""
        before = self.named[state_name].tokens if state_name is not None else 0
        return save_final_state(self.save_dir, request_id, out.final_state,
                                before + out.prompt_tokens + out.generated_tokens, self.config, self.dtype)
