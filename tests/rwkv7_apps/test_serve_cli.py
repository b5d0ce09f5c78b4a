"""rwkv7-serve's command line: bad options fail at once with exit 2 and a message."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("args, message", [
    (["--model", "/nonexistent/model.pth"], "no such file"),
    (["--random-model", "tiny", "--max-waiting", "0"], "--max-waiting must be >= 1"),
    (["--random-model", "tiny", "--kernels", "triton"], "--kernels triton is not available"),
    (["--random-model", "tiny", "--top-p", "2"], "top_p"),
])
def test_bad_options_exit_2_with_a_message(tmp_path, args, message):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path))
    run = subprocess.run([sys.executable, "-m", "rwkv7_apps.serve", *args], capture_output=True, text=True,
                         timeout=120, env=env)
    assert run.returncode == 2 and message in run.stderr, run.stderr[-2000:]
