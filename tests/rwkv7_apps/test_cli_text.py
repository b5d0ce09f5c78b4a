"""rwkv7-generate on the bundled example prompts with a World-vocabulary random model (the
`make demo` path, torch backend): text prompts are tokenized, outputs carry decoded text,
greedy requests equal the reference decode, stop strings end generation."""
from __future__ import annotations

import json
from importlib import resources

from tests.rwkv7_apps.cli_harness import greedy_reference, read_results, run_cli

GREEDY_CHECKED = ("greet", "count", "sys-physics", "zh", "tokens-example")  # plain greedy requests


def test_example_prompts_with_world_tokenizer(tmp_path, monkeypatch):
    import rwkv_torch_ref
    from rwkv7_apps.engines import random_model_path
    from rwkv7_core.tokenizer import tokenizer_for

    example = resources.files("rwkv7_apps") / "data" / "example_prompts.jsonl"
    rows = [json.loads(line) for line in example.read_text().splitlines()]
    out = tmp_path / "out.jsonl"
    proc = run_cli(["--random-model", "tiny-world", "--backend", "torch", "--input", example, "--output", out,
                    "--max-tokens", 8, "--max-batch", 8], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["id"]: r for r in read_results(out)}
    assert sorted(results) == sorted(r["id"] for r in rows) and len(read_results(out)) == len(rows)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = rwkv_torch_ref.load(random_model_path("tiny-world"))
    tok = tokenizer_for(65536)
    assert model.config.vocab_size == 65536
    assert set(GREEDY_CHECKED) <= set(results)
    for row in rows:
        got = results[row["id"]]
        assert got["finish_reason"] in ("length", "stop"), got
        assert got["text"] == tok.decode(got["tokens"])
        prompt = row["tokens"] if "tokens" in row else tok.encode(row["prompt"])
        assert got["prompt_tokens"] == len(prompt)
        max_tokens = row.get("max_tokens", 8)
        for stop in row.get("stop", []):  # generation never runs past a completed stop string
            assert stop not in tok.decode(got["tokens"][:-1])
        if row["id"] in GREEDY_CHECKED:
            assert got["tokens"] == greedy_reference(model, prompt, max_tokens, as_torch=True), row["id"]
