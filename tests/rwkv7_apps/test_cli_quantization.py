"""rwkv7-generate --quantization end to end on the tiny model, and rwkv7-convert --quantization."""
import numpy as np

import rwkv_torch_ref
from rwkv7_apps.convert import main as convert
from tests.rwkv7_apps.cli_harness import greedy_reference, random_token_requests, read_results, run_cli, write_jsonl


def test_generate_int8_matches_the_quantized_reference_and_convert_round_trips(tiny_ckpt, tmp_path):
    ckpt = tiny_ckpt.with_suffix(".safetensors")
    quantized = tmp_path / "int8.safetensors"
    assert convert([str(ckpt), "--to", "safetensors", "--out", str(quantized), "--quantization", "int8"]) == 0
    reqs = random_token_requests(np.random.default_rng(7), 3, 512, lengths=(5,), max_tokens=(6,))
    ref = rwkv_torch_ref.load(ckpt, quantization="int8")
    want = {r["id"]: greedy_reference(ref, r["tokens"], r["max_tokens"], as_torch=True) for r in reqs}
    inp = write_jsonl(tmp_path / "in.jsonl", reqs)
    out = tmp_path / "out.jsonl"
    proc = run_cli(["--model", quantized, "--quantization", "int8", "--input", inp, "--output", out,
                    "--max-batch", 2, "--buckets", "2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {r["id"]: r["tokens"] for r in read_results(out)} == want
    wrong = run_cli(["--model", quantized, "--quantization", "fp8", "--input", inp, "--output", tmp_path / "x.jsonl"],
                    tmp_path)
    assert wrong.returncode == 2
    assert "holds int8 (groups of 128) weights but quantization fp8 was requested" in wrong.stderr
