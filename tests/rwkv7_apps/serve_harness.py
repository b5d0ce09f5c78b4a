"""Helpers of the rwkv7-serve tests: a real server subprocess on a free loopback port,
waited for until /health answers 200, always stopped (not a test module)."""
from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path, cache: Path):
        self.proc, self.port, self.log, self.cache = proc, port, log, cache
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, headers: dict | None = None) -> tuple[int, str]:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path: str, body: bytes, headers: dict | None = None) -> tuple[int, str]:
        request = urllib.request.Request(self.url + path, data=body, method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name: str, labels: str = "") -> float:
        """A sample's value from /metrics (0 when absent); labels as 'state="running"'."""
        text = self.get("/metrics")[1]
        pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" ([0-9.e+-]+)"
        match = re.search(r"^" + pattern + r"$", text, re.M)
        return float(match.group(1)) if match else 0.0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def running_server(args: list[str], tmp_path: Path, timeout: float = 300, precompile: bool = False,
                   env: dict | None = None):
    """Start ``python -m rwkv7_apps.serve ARGS --port P`` and yield a Server once healthy.
    Without ``precompile`` the server gets ``--no-precompile`` (its default precompile of every
    bucket, prefill piece and logprob path adds ~10-30 s a start on a 2-core machine; the tests
    of that path, test_serve_precompile.py, ask for it); ``env``: extra environment."""
    port = free_port()
    log = tmp_path / "server.log"
    cache = tmp_path / "cache"
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1", **(env or {}))
    args = [*map(str, args), "--port", str(port)] + ([] if precompile else ["--no-precompile"])
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rwkv7_apps.serve", *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, port, log, cache)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log_text()}")
            with contextlib.suppress(OSError):
                if server.get("/health")[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {timeout} s:\n{server.log_text()}")
            time.sleep(0.3)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def in_process_server(app, service):
    """Serve ``app`` (``build_app``'s) with uvicorn on a free loopback port in a thread of
    this process, ``service`` started; yields the /v1 base URL; always stopped."""
    import threading

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    service.start()
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{server.config.port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        service.stop()
