"""lm-evaluation-harness (``local-completions``, the loglikelihood of each choice via
echo + logprobs, token counts through the server's /tokenizer_info + /tokenize) against a
real rwkv7-serve on loopback, on a small multiple-choice task written here (local JSONL,
no hub): every per-item loglikelihood equals the one BlinkDL's ``rwkv`` package computes on
the same random checkpoint, including the items whose greedy continuation is the stop
token 0 (there lm-eval drops the last echoed logprob, which must be the stop token's)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")
pytest.importorskip("rwkv")

from rwkv7_core import named_config  # noqa: E402
from rwkv7_core.checkpoint import write_checkpoint  # noqa: E402
from rwkv7_core.constants import WORLD_VOCAB_SIZE  # noqa: E402
from rwkv7_core.random_weights import random_tensors  # noqa: E402
from rwkv7_core.tokenizer import tokenizer_for  # noqa: E402
from tests.rwkv7_apps.serve_harness import running_server  # noqa: E402

TASK = "rwkv7_clients_mc"
WORDS = "red green blue cat dog tree river stone cloud seven paper light".split()


def _official(path):
    os.environ["RWKV_V7_ON"] = "1"  # read when rwkv.model is imported
    from rwkv.model import RWKV
    return RWKV(model=str(path.with_suffix("")), strategy="cpu fp32")


def _log_softmax(logits) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    return x - (np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) + x.max(-1, keepdims=True))


def _docs(rng) -> list[dict]:
    docs = []
    for i in range(6):
        words = rng.choice(WORDS, size=int(rng.integers(2, 7))).tolist()
        docs.append({"question": f"Q{i}: {' '.join(words)}?", "choices": rng.choice(WORDS, 3, replace=False).tolist(),
                     "answer": int(rng.integers(0, 3))})
    return docs


def _expected(official, tok, context: str, continuation: str) -> tuple[float, list[int]]:
    """(loglikelihood of continuation given context, the whole token ids) as lm-eval splits
    them: context tokens, then the rest of the whole text's tokens."""
    ctx, whole = tok.encode(context), tok.encode(context + continuation)
    logits, _ = official.forward(whole, None, full_output=True)
    lp = _log_softmax(logits.float().numpy())
    return float(sum(lp[t - 1, whole[t]] for t in range(len(ctx), len(whole)))), whole


def _checkpoint(tmp_path, docs, tok):
    """A random tiny World-vocabulary checkpoint whose head makes the stop token 0 the
    greedy next token after the first document's first choice (the row of token 0 points
    along that position's final hidden vector, recovered from the logits)."""
    config = named_config("tiny")._replace(vocab_size=WORLD_VOCAB_SIZE)
    tensors = random_tensors(config, seed=int(np.random.default_rng().integers(1 << 30)))
    path = tmp_path / "model.pth"
    write_checkpoint(path, tensors)
    whole = tok.encode(docs[0]["question"] + " " + docs[0]["choices"][0])
    logits = _official(path).forward(whole, None)[0].float().numpy().astype(np.float64)
    head = np.asarray(tensors["head.weight"], np.float64)
    hidden = np.linalg.lstsq(head, logits, rcond=None)[0]
    head[0] = hidden * (logits.max() + 5.0) / (hidden @ hidden)
    tensors["head.weight"] = head.astype(np.float32)
    write_checkpoint(path, tensors)
    return path


def test_lm_eval_loglikelihoods_equal_the_official_package(tmp_path, monkeypatch):
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    rng = np.random.default_rng()
    tok = tokenizer_for(WORLD_VOCAB_SIZE)
    docs = _docs(rng)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "task.yaml").write_text(
        f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: choices\ndoc_to_target: answer\nmetric_list:\n  - metric: acc\n")
    path = _checkpoint(tmp_path, docs, tok)
    official = _official(path)

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    with running_server(["--model", path, "--dtype", "float32", "--max-batch", "4", "--served-model-name", "m"],
                        tmp_path) as server:
        results = simple_evaluate(
            model="local-completions",
            model_args=f"base_url={server.url}/v1/completions,model=m,num_concurrent=4,max_retries=1",
            tasks=[TASK], task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
            log_samples=True)
    samples = results["samples"][TASK]
    assert len(samples) == len(docs)
    stop_items = 0
    for sample in samples:
        doc = sample["doc"]
        for choice, resp in zip(doc["choices"], sample["resps"], strict=True):
            loglik, is_greedy = resp[0]
            want, whole = _expected(official, tok, doc["question"], " " + choice)
            assert loglik == pytest.approx(want, rel=1e-5, abs=2e-4), (doc, choice)
            last = official.forward(whole, None)[0].float().numpy()
            stop_items += int(np.argmax(last) == 0)
    assert stop_items >= 1  # the stop-token case was exercised
    acc = results["results"][TASK]["acc,none"]
    assert 0.0 <= acc <= 1.0
