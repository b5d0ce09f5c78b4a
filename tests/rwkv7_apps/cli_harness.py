"""Helpers of the rwkv7-generate tests: running the console script, JSONL files, and the
one-token-at-a-time reference decode (not a test module)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SCRIPT = str(Path(sys.executable).with_name("rwkv7-generate"))


def write_jsonl(path: Path, rows: list) -> Path:
    """rows: dicts (dumped as JSON) or raw strings (written as they are)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_results(path: Path) -> list[dict]:
    """Output records; asserts the file ends with a newline (no torn line)."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "torn last line"
    return [json.loads(line) for line in data.decode().splitlines()]


def cli_env(tmp_path: Path) -> dict:
    # one intra-op thread: the tiny model gains nothing from more, and pytest -n 2 runs two at once
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
    env.pop("TQDM_DISABLE", None)
    return env


def run_cli(args: list[str], tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=cli_env(tmp_path))


def start_cli(args: list[str], tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([SCRIPT, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env(tmp_path))


def random_token_requests(rng: np.random.Generator, n: int, vocab: int, lengths, max_tokens) -> list[dict]:
    return [{"id": f"req-{i}", "tokens": rng.integers(1, vocab, size=int(rng.choice(lengths))).tolist(),
             "max_tokens": int(rng.choice(max_tokens))} for i in range(n)]


def greedy_reference(model, prompt: list[int], max_tokens: int, stop_tokens=(0,), as_torch=False) -> list[int]:
    """Greedy decode of one request alone (B=1) with ``model.forward``: the prompt in one call
    for torch (token by token for JAX, so that one executable serves every prompt length),
    then one token at a time."""
    state = model.init_state(1)
    logits = None
    for piece in ([prompt] if as_torch else [[t] for t in prompt]):
        logits, state = model.forward(_tokens([piece], as_torch), state)
    out: list[int] = []
    while len(out) < max_tokens:
        token = int(np.argmax(np.asarray(logits, dtype=np.float32)[0]))
        if token in stop_tokens:
            break
        out.append(token)
        logits, state = model.forward(_tokens([[token]], as_torch), state)
    return out


def _tokens(rows, as_torch: bool):
    if as_torch:
        import torch
        return torch.tensor(rows, dtype=torch.int64)
    return np.asarray(rows, dtype=np.int32)


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    """Block until ``path`` holds at least n complete lines (fails if the process ends first)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    raise AssertionError(f"no {n} results within {timeout} s")
