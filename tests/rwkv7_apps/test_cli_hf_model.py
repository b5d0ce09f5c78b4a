"""rwkv7-generate --model DIR: a Hugging Face model directory runs end to end, greedy
results equal to the .pth's; a bad one is named in one line; the prefix cache's fingerprint
of a directory follows its files."""
from __future__ import annotations

import rwkv_torch_ref
from rwkv7_apps.tools.convert import main as convert
from tests.rwkv7_apps.cli_harness import greedy_reference, read_results, run_cli, write_jsonl


def test_generate_from_hf_directory(tiny_ckpt, tmp_path):
    hf = tmp_path / "tiny-hf"
    assert convert([str(tiny_ckpt), "--to", "hf", "--out", str(hf)]) == 0
    reqs = [{"id": "a", "tokens": [3, 1, 4, 1], "max_tokens": 5, "temperature": 0}]
    out = tmp_path / "out.jsonl"
    proc = run_cli(["--model", hf, "--backend", "torch", "--input", write_jsonl(tmp_path / "in.jsonl", reqs),
                    "--output", out], tmp_path)  # torch: no compile; the loader is the one JAX uses
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = rwkv_torch_ref.load(tiny_ckpt, dtype="float32")
    assert read_results(out)[0]["tokens"] == greedy_reference(model, reqs[0]["tokens"], 5, as_torch=True)


def test_generate_names_a_bad_directory_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text('{"model_type": "mamba"}')
    proc = run_cli(["--model", tmp_path / "empty", "--input", write_jsonl(tmp_path / "in.jsonl", []),
                    "--output", tmp_path / "out.jsonl"], tmp_path)
    assert proc.returncode == 2 and "model_type 'mamba'" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_prefix_cache_fingerprint_of_a_directory(tiny_ckpt, tmp_path):
    """The disk prefix cache names a model directory by its config and weight files."""
    from rwkv7_apps.states import checkpoint_digest

    hf = tmp_path / "tiny-hf"
    assert convert([str(tiny_ckpt), "--to", "hf", "--out", str(hf), "--max-shard-mb", "1"]) == 0
    first = checkpoint_digest(hf, tmp_path / "cache")
    assert checkpoint_digest(hf, tmp_path / "cache") == first
    shard = sorted(hf.glob("model-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-4] + b"\x00\x00\x80\x3f")  # one float of lm_head changed
    assert checkpoint_digest(hf, tmp_path / "cache") != first


def test_generate_names_a_malformed_vocabulary_in_one_line(tmp_path):
    """A World-vocabulary directory whose vocab file is malformed fails at load in one line (it
    was a Rust panic)."""
    from rwkv7_core.config import ModelConfig
    from rwkv7_core.random_weights import write_random_checkpoint

    pth = tmp_path / "world.pth"
    write_random_checkpoint(pth, ModelConfig(1, 64, 1, 64, 65536, 128, 16, 16, 16, 16), seed=3)
    hf = tmp_path / "world-hf"
    assert convert([str(pth), "--to", "hf", "--out", str(hf)]) == 0
    (hf / "rwkv_vocab_v20230424.txt").write_text("1 'a' 1\n2 'bc' 5\n")
    proc = run_cli(["--model", hf, "--backend", "torch", "--input", write_jsonl(tmp_path / "in.jsonl", []),
                    "--output", tmp_path / "out.jsonl"], tmp_path)
    assert proc.returncode == 2 and "line 2: token 2" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
