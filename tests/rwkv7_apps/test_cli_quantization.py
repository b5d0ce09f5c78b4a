"""rwkv7-generate --quantization end to end on the tiny model, and rwkv7-convert --quantization."""
import numpy as np
import pytest

import rwkv_torch_ref
from rwkv7_apps.tools.convert import main as convert
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


def test_group_size_option_reaches_the_model_and_bad_sizes_fail_at_load(tiny_ckpt, tmp_path, capsys):
    """--group-size (declared once in rwkv7_apps.options) on rwkv7-convert and rwkv7-generate:
    the converted file records it, generate from the float checkpoint with it matches the
    torch reference quantized with it, and a size that does not divide a width, a size with
    fp8, or a size other than the stored one fail at load with one line."""
    from rwkv7_apps.generate.cli import main as generate

    ckpt = tiny_ckpt.with_suffix(".safetensors")
    quantized = tmp_path / "int8-g32.safetensors"
    assert convert([str(ckpt), "--to", "safetensors", "--out", str(quantized), "--quantization", "int8",
                    "--group-size", "32"]) == 0
    assert rwkv_torch_ref.load(quantized, quantization="int8").quant.group_size == 32
    reqs = random_token_requests(np.random.default_rng(11), 2, 512, lengths=(4,), max_tokens=(5,))
    ref = rwkv_torch_ref.load(ckpt, quantization="int8", group_size=32)
    want = {r["id"]: greedy_reference(ref, r["tokens"], r["max_tokens"], as_torch=True) for r in reqs}
    inp = write_jsonl(tmp_path / "in.jsonl", reqs)
    out = tmp_path / "out.jsonl"
    proc = run_cli(["--model", ckpt, "--quantization", "int8", "--group-size", 32, "--input", inp, "--output", out,
                    "--max-batch", 2, "--buckets", "2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {r["id"]: r["tokens"] for r in read_results(out)} == want
    capsys.readouterr()
    for model, extra, message in [
            (ckpt, ["--quantization", "int8", "--group-size", "48"],
             "quantization group size 48 does not divide its width 128"),
            (ckpt, ["--quantization", "fp8", "--group-size", "32"], "group size 32 applies to int8 and int4 only"),
            (quantized, ["--quantization", "int8", "--group-size", "64"],
             "holds int8 (groups of 32) weights but quantization int8 (groups of 64) was requested")]:
        with pytest.raises(SystemExit) as exit_info:
            generate(["--model", str(model), *extra, "--input", str(inp), "--output", str(tmp_path / "x.jsonl")])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err, err[-2000:]
        assert len(err.strip().splitlines()) == 1, err[-2000:]


def test_convert_and_generate_int4(tiny_ckpt, tmp_path):
    """rwkv7-convert --quantization int4 writes packed q (uint8 [out, in / 2]) and its group;
    rwkv7-generate on it gives the int4-quantized torch reference's greedy tokens."""
    from rwkv7_core.checkpoint import read_checkpoint

    ckpt = tiny_ckpt.with_suffix(".safetensors")
    quantized = tmp_path / "int4.safetensors"
    assert convert([str(ckpt), "--to", "safetensors", "--out", str(quantized), "--quantization", "int4",
                    "--group-size", "64"]) == 0
    tensors, config = read_checkpoint(quantized)
    assert tensors.dtype("head.weight") == np.uint8
    assert tensors.shape("head.weight") == (config.vocab_size, config.n_embd // 2)
    reqs = random_token_requests(np.random.default_rng(13), 2, 512, lengths=(4,), max_tokens=(5,))
    ref = rwkv_torch_ref.load(ckpt, quantization="int4", group_size=64)
    want = {r["id"]: greedy_reference(ref, r["tokens"], r["max_tokens"], as_torch=True) for r in reqs}
    inp = write_jsonl(tmp_path / "in.jsonl", reqs)
    out = tmp_path / "out.jsonl"
    proc = run_cli(["--model", quantized, "--quantization", "int4", "--input", inp, "--output", out,
                    "--max-batch", 2, "--buckets", "2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {r["id"]: r["tokens"] for r in read_results(out)} == want


@pytest.mark.parametrize("method", ["gptq", "search"])
def test_convert_calibrated_int4_lowers_each_projections_error_on_the_calibration_inputs(tiny_ckpt, tmp_path, method):
    """rwkv7-convert --calibration: the file loads and runs as any int4 checkpoint, and on the
    calibration text's inputs (their Gram matrices from the float model) its projections'
    output error is below round-to-nearest's."""
    from rwkv7_core.checkpoint import read_checkpoint
    from rwkv7_core.quantization import dequantize, quantized_key, scale_key
    from rwkv_torch_ref.calibration import input_gram

    ckpt = tiny_ckpt.with_suffix(".safetensors")
    rng = np.random.default_rng()
    tokens = rng.integers(0, 512, 600)
    text = tmp_path / "calibration.txt"
    text.write_text(" ".join(map(str, tokens)))
    rtn, calibrated = tmp_path / "rtn.safetensors", tmp_path / f"{method}.safetensors"
    base = [str(ckpt), "--to", "safetensors", "--quantization", "int4", "--group-size", "32"]
    assert convert([*base, "--out", str(rtn)]) == 0
    assert convert([*base, "--out", str(calibrated), "--calibration", str(text), "--calibration-method", method]) == 0
    grams = input_gram(rwkv_torch_ref.load(ckpt), tokens)
    float_tensors, _ = read_checkpoint(ckpt)
    errors = {}
    for name, path in (("rtn", rtn), (method, calibrated)):
        tensors, _ = read_checkpoint(path)
        errors[name] = {}
        for key, gram in grams.items():
            diff = np.asarray(float_tensors[key], np.float64) - dequantize(tensors[key], tensors[scale_key(key)])
            errors[name][key] = float(np.einsum("oi,ij,oj->", diff, gram, diff))
    assert set(errors["rtn"]) == {k for k in float_tensors if quantized_key(k)}
    assert sum(errors[method].values()) < 0.95 * sum(errors["rtn"].values()), errors
    reqs = random_token_requests(np.random.default_rng(3), 2, 512, lengths=(5,), max_tokens=(4,))
    ref = rwkv_torch_ref.load(calibrated, quantization="int4")
    want = {r["id"]: greedy_reference(ref, r["tokens"], r["max_tokens"], as_torch=True) for r in reqs}
    out = tmp_path / "out.jsonl"
    proc = run_cli(["--model", calibrated, "--quantization", "int4", "--input", write_jsonl(tmp_path / "in.jsonl", reqs),
                    "--output", out, "--max-batch", 2, "--buckets", "2"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {r["id"]: r["tokens"] for r in read_results(out)} == want


def test_convert_calibration_errors_name_the_file(tiny_ckpt, tmp_path, capsys):
    ckpt = str(tiny_ckpt.with_suffix(".safetensors"))
    short, words = tmp_path / "short.txt", tmp_path / "words.txt"
    short.write_text("1 2 3")
    words.write_text("1 2 hello 4 " * 40)
    base = [ckpt, "--to", "safetensors", "--out", str(tmp_path / "x.safetensors"), "--quantization", "int4",
            "--calibration"]
    assert convert([*base, str(short)]) == 2
    assert "short.txt': 3 tokens, fewer than the 64 calibration needs" in capsys.readouterr().err
    assert convert([*base, str(words)]) == 2
    assert "words.txt': word 2 ('hello') is not a token id below 512" in capsys.readouterr().err
    assert convert([*base, str(tmp_path / "missing.txt")]) == 2
    assert "calibration file" in capsys.readouterr().err and not (tmp_path / "x.safetensors").exists()
    with pytest.raises(SystemExit):
        convert([ckpt, "--to", "safetensors", "--out", str(tmp_path / "y.safetensors"), "--quantization", "fp8",
                 "--calibration", str(words)])
    assert "--calibration needs --quantization int8 or int4" in capsys.readouterr().err
