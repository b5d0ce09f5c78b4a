"""The chat template's token ids through the real World tokenizer, over random multi-turn
histories (multi-byte UTF-8, blank lines, role words and colons in the texts): they spell
``render``'s text, and turn k+1's ids begin with exactly turn k's prompt ids followed by the
reply's ids (the tokenizer's own encoding of its text, or the ids the model generated when
the server remembers them), so the turn cache can serve everything but the new message."""
import numpy as np
import pytest

from rwkv7_apps.serve.chat import ReplyTokens, clean, encode, render, reply_ids
from rwkv7_core.tokenizer import WorldTokenizer

PIECES = ["a", "Hello", " ", "  ", "\n", "\n\n", "\n \n", "\r\n", ":", "User:", "Assistant:", "é", "你好", "🙂",
          "Ж", "ü", "\t", "1.5", "''", "<|", "ＡＢ"]


@pytest.fixture(scope="module")
def tok():
    return WorldTokenizer()


def _text(rng) -> str:
    return "".join(PIECES[i] for i in rng.integers(0, len(PIECES), int(rng.integers(0, 12))))


def _history(rng, turns):
    messages = [("system", _text(rng))] if rng.random() < 0.5 else []
    for _ in range(turns):
        messages += [("user", _text(rng)), ("assistant", _text(rng))]
    return messages


def test_ids_spell_the_rendered_text_and_each_turn_extends_the_last(tok):
    rng = np.random.default_rng()
    for _ in range(30):
        messages = _history(rng, int(rng.integers(1, 5)))
        assert tok.decode_bytes(encode(tok, messages)) == render(messages).encode()
        turn_starts = [i for i, (role, _) in enumerate(messages) if role == "assistant"]
        for i in turn_starts:
            prompt = encode(tok, messages[:i])           # turn k's prompt: up to the user message
            reply = tok.encode(f" {clean(messages[i][1])}")
            later = encode(tok, messages[:i + 2])         # turn k+1: the reply and the next message
            assert later[:len(prompt) + len(reply)] == prompt + reply


def test_a_remembered_reply_comes_back_as_the_generated_ids(tok):
    rng = np.random.default_rng()
    replies = ReplyTokens()
    messages = [("user", _text(rng))]
    for _ in range(4):
        prompt = encode(tok, messages, replies)
        generated = rng.integers(0, 65536, int(rng.integers(1, 30))).tolist()  # not the text's own encoding
        text = tok.decode_bytes(generated).decode("utf-8", errors="replace")
        replies.remember(prompt, text, reply_ids(tok, generated, text, stopped=False))
        messages += [("assistant", text), ("user", _text(rng))]
        later = encode(tok, messages, replies)
        assert later[:len(prompt) + len(generated)] == prompt + generated
    # the same reply text after other ids is not that reply: the text's own encoding
    start = encode(tok, [("user", "another chat")], replies)
    other = encode(tok, [("user", "another chat")] + messages[1:3], replies)
    own = tok.encode(f" {clean(messages[1][1])}")
    assert other[len(start):len(start) + len(own)] == own


def test_reply_ids_of_a_text_cut_by_a_stop_string(tok):
    reply, stop = tok.encode(" Hi there 你好"), tok.encode("\n\nUser:")
    assert reply_ids(tok, reply + stop, " Hi there 你好", stopped=True) == reply
    assert reply_ids(tok, reply + stop, " Hi the", stopped=True) is None  # the cut fell inside a token
    assert reply_ids(tok, reply + stop, " Hi there 你好\n\nUser:", stopped=False) == reply + stop


def test_reply_tokens_are_bounded_least_recently_used_first():
    replies = ReplyTokens(max_tokens=10)
    replies.remember([1], "a", [5] * 4)
    replies.remember([2], "b", [6] * 4)
    assert replies.get([1], "a") == [5] * 4  # now the most recent
    replies.remember([3], "c", [7] * 4)      # 12 ids > 10: "b" goes
    assert replies.get([2], "b") is None and replies.get([1], "a") and replies.get([3], "c")
    assert replies.tokens == 8 and replies.get([1], "b") is None
