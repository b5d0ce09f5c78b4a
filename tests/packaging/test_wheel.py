"""The built wheel, as a user gets it: it holds every project package and nothing else, and
a plain ``pip install`` of it into a fresh virtual environment runs ``rwkv7-generate`` on a
random World-vocabulary model (text prompts, progress, metrics and plot: no extra needed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"rwkv7_core", "rwkv_torch_ref", "rwkv_jax", "pallas_kernels", "cpu_kernels", "scheduler", "rwkv7_apps"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=600)
    (path,) = out.glob("rwkv7_engine-*.whl")
    return path


def test_wheel_holds_every_project_package_and_nothing_else(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == PACKAGES
    for package in PACKAGES:  # every source package of the tree, subpackages included
        for source in (ROOT / package).rglob("*.py"):
            assert source.relative_to(ROOT).as_posix() in names
    assert "rwkv_torch_ref/triton_kernels/wkv7_step.py" in names
    assert "rwkv7_apps/data/example_prompts.jsonl" in names
    assert "cpu_kernels/linear.cc" in names  # the native CPU kernels are built from it on first use
    assert {"rwkv_jax/gpu_targets/h200.txtpb", "rwkv_jax/gpu_targets/h100.txtpb"} <= set(names)  # rwkv7-gpu-compile
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)


@pytest.mark.single_stack
def test_plain_install_runs_generate(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    # nothing of the checkout may be visible: a source tree on PYTHONPATH (with its build's
    # egg-info) would make pip think the package is installed already
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=1200, env=env, cwd=tmp_path)
    assert install.returncode == 0, install.stderr[-3000:]
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "Hello, world"}) + "\n"
                       + json.dumps({"id": "b", "tokens": [1, 2, 3], "max_tokens": 3}) + "\n")
    out = tmp_path / "out.jsonl"
    env.update(JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path / "cache"))
    run = subprocess.run([str(bin_dir / "rwkv7-generate"), "--random-model", "tiny-world", "--input", str(prompts),
                          "--output", str(out), "--max-tokens", "4", "--metrics", str(tmp_path / "m.json"),
                          "--plot", str(tmp_path / "run.png")],
                         capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"a", "b"} and all(r["finish_reason"] in ("length", "stop") for r in records.values())
    assert isinstance(records["a"]["text"], str) and records["b"]["generated_tokens"] <= 3
    assert json.loads((tmp_path / "m.json").read_text())["requests"]["ok"] == 2
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the installed command is the wheel's, not the checkout's
    where = subprocess.run([str(bin_dir / "python"), "-c", "import rwkv7_apps; print(rwkv7_apps.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert str(env_dir) in where.stdout
    # the server's stack came with the plain install too (rwkv7-serve needs no extra)
    serve = subprocess.run([str(bin_dir / "python"), "-c", "import rwkv7_apps.serve.app, uvicorn"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert serve.returncode == 0 and (bin_dir / "rwkv7-serve").is_file(), serve.stderr[-2000:]
