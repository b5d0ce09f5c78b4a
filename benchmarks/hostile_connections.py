"""Hostile connections against a real ``rwkv7-serve --random-model tiny-world`` (issue 37,
items 3 and 5): idle and slowloris sockets left open, /health under a small descriptor limit
with more idle sockets than descriptors, and /health latency while clients send large
/tokenize bodies (``--tokenize-clients`` at once, three rounds).

Run it against this tree, or against another checkout (``--root DIR``: the code tested; its
server must accept the options given in ``--server-args``)::

    python benchmarks/hostile_connections.py --label after
    python benchmarks/hostile_connections.py --label before --root /tmp/before --server-args ""

Prints one JSON line per label and appends it to benchmarks/results/hostile_connections.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "hostile_connections.jsonl"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(port: int) -> tuple[int | str, float]:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            return r.status, time.perf_counter() - t0
    except Exception as e:  # a reset or refusal is the measurement
        return type(e).__name__, time.perf_counter() - t0


def _start(root: str, extra: list[str], nofile: int | None) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")

    def limit() -> None:
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen([sys.executable, "-m", "rwkv7_apps.serve", "--random-model", "tiny-world",
                             "--max-batch", "8", "--no-precompile", "--port", str(port), *extra],
                            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=limit)
    deadline = time.monotonic() + 300
    while _health(port)[0] != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.5)
    return proc, port


def _open_after(socks: list[socket.socket]) -> int:
    still = 0
    for s in socks:
        s.settimeout(0.2)
        try:
            still += s.recv(1) != b""
        except socket.timeout:
            still += 1
        except OSError:
            pass
        s.close()
    return still


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--label", required=True)
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--server-args", default="--header-timeout 2")
    p.add_argument("--idle", type=int, default=300)
    p.add_argument("--wait", type=float, default=4.0)
    p.add_argument("--tokenize-clients", type=int, default=4)
    a = p.parse_args()
    extra = a.server_args.split()
    out: dict = {"label": a.label, "server_args": a.server_args}

    proc, port = _start(a.root, extra, None)
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(a.idle)]
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(a.idle)]
        for s in slow:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        time.sleep(a.wait)
        out["idle_open_after_s"] = a.wait
        out["idle_still_open"] = _open_after(idle)
        out["slowloris_still_open"] = _open_after(slow)
        text = " ".join(["alpha beta gamma delta"] * 150_000)  # ~3.3 MB
        body = json.dumps({"prompt": text}).encode()

        def tokenize() -> None:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as r:
                r.read()

        latencies = []
        for _ in range(3):
            clients = [threading.Thread(target=tokenize) for _ in range(a.tokenize_clients)]
            for t in clients:
                t.start()
            while any(t.is_alive() for t in clients):
                latencies.append(_health(port)[1])
                time.sleep(0.05)
            for t in clients:
                t.join()
        under = f"under_{a.tokenize_clients}_tokenize"
        out[f"health_median_s_{under}"] = round(statistics.median(latencies), 4)
        out[f"health_max_s_{under}"] = round(max(latencies), 4)
        out[f"health_samples_{under}"] = len(latencies)
    finally:
        proc.terminate()
        proc.wait()

    proc, port = _start(a.root, extra, 256)
    try:
        socks = []
        for _ in range(300):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break
        time.sleep(0.5)
        out["fd_limit"] = 256
        out["idle_sockets_opened"] = len(socks)
        codes = [_health(port)[0] for _ in range(10)]
        out["health_ok_of_10_with_idle_sockets"] = sum(c == 200 for c in codes)
        for s in socks:
            s.close()
    finally:
        proc.terminate()
        proc.wait()
    line = json.dumps(out)
    print(line)
    RESULTS.parent.mkdir(exist_ok=True)
    with open(RESULTS, "a") as f:
        f.write(line + "\n")


if __name__ == "__main__":
    main()
