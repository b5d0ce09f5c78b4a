"""rwkv7-serve --state NAME=FILE (torch backend, tiny-world random model): a request's
``state`` changes its output exactly as rwkv7-generate's --state does, for completions and
chat; an unknown name is a 400 naming it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rwkv7_apps.engines import random_model_config
from rwkv7_core.state_files import save_state, zero_state
from rwkv7_core.tokenizer import WorldTokenizer
from tests.rwkv7_apps.cli_harness import cli_env, read_results, write_jsonl
from tests.rwkv7_apps.serve_harness import running_server

openai = pytest.importorskip("openai")
TOKENS = 8


def random_state_file(path: Path) -> Path:
    """A random (non-zero) state of the tiny-world shape, written to ``path``."""
    config = random_model_config("tiny-world")
    rng = np.random.default_rng()
    zero = zero_state(config)
    state = zero._replace(att_shift=rng.normal(0, 1, zero.att_shift.shape).astype(np.float32),
                          wkv=rng.normal(0, 0.5, zero.wkv.shape).astype(np.float32),
                          ffn_shift=rng.normal(0, 1, zero.ffn_shift.shape).astype(np.float32), tokens=5)
    save_state(path, state, config)
    return path


def test_a_named_state_changes_the_output_as_the_batch_cli_does(tmp_path):
    state_file = random_state_file(tmp_path / "tuned.safetensors")
    chat_prompt = "User: hi there\n\nAssistant:"
    prompt = np.random.default_rng().integers(1, 65536, 5).tolist()
    served = {}
    with running_server(["--random-model", "tiny-world", "--backend", "torch", "--state", f"tuned={state_file}",
                         "--max-batch", 2], tmp_path) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        for state in ("tuned", None):
            out = client.completions.create(model=None, prompt=prompt, temperature=0, max_tokens=TOKENS,
                                            extra_body={"return_token_ids": True, "state": state})
            served[state] = out.choices[0].model_extra["token_ids"]
            reply = client.chat.completions.create(model=None, messages=[{"role": "user", "content": "hi there"}],
                                                   temperature=0, max_tokens=TOKENS, extra_body={"state": state})
            served["chat", state] = reply.choices[0].message.content
        with pytest.raises(openai.BadRequestError, match=r"state: unknown state 'other' \(registered: tuned\)"):
            client.completions.create(model=None, prompt=prompt, max_tokens=1, extra_body={"state": "other"})
        cache = server.cache
    assert served["tuned"] != served[None]
    rows = [{"id": "s", "tokens": prompt, "state": "tuned"}, {"id": "z", "tokens": prompt},
            {"id": "cs", "prompt": chat_prompt, "state": "tuned", "stop": ["\n\nUser:"]},
            {"id": "cz", "prompt": chat_prompt, "stop": ["\n\nUser:"]}]
    inp, out = write_jsonl(tmp_path / "in.jsonl", [{**r, "temperature": 0, "max_tokens": TOKENS} for r in rows]), \
        tmp_path / "out.jsonl"
    env = {**cli_env(tmp_path), "XDG_CACHE_HOME": str(cache)}  # the same random model file
    proc = subprocess.run([sys.executable, "-m", "rwkv7_apps.generate", "--random-model", "tiny-world", "--backend",
                           "torch", "--input", inp, "--output", out, "--state", f"tuned={state_file}"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    batch = {r["id"]: r for r in read_results(out)}
    assert (batch["s"]["tokens"], batch["z"]["tokens"]) == (served["tuned"], served[None])
    tok = WorldTokenizer()
    for key, state in (("cs", "tuned"), ("cz", None)):
        assert tok.decode(batch[key]["tokens"]).split("\n\nUser:")[0] == served["chat", state]
