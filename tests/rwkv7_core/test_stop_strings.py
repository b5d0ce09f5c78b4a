"""The incremental stop-string matcher (rwkv7_core/stop_strings.py) against a brute-force
rescan, on fresh random texts cut into random pieces (characters of 1-4 UTF-8 bytes split
anywhere), and its cost: linear in the text, whatever the stop strings."""
from __future__ import annotations

import sys

import numpy as np

from rwkv7_core.sampling import MAX_STOP_LENGTH, MAX_STOP_STRINGS
from rwkv7_core.stop_strings import StopMatcher

ALPHABET = "ab\u00e9\u4e2d\U0001f600"  # 1, 1, 2, 3 and 4 UTF-8 bytes


def random_text(rng, n: int) -> str:
    return "".join(rng.choice(list(ALPHABET), n))


def first_completion(text: str, stops) -> tuple[int, int]:
    """(end of the first stop string to complete, its length: the longest ending there), or (-1, 0)."""
    ends = [(text.find(s) + len(s), len(s)) for s in stops if s in text]
    if not ends:
        return -1, 0
    end = min(e for e, _ in ends)
    return end, max(n for e, n in ends if e == end)


def pieces(rng, data: bytes) -> list[bytes]:
    cuts = sorted(set(rng.integers(0, len(data) + 1, int(rng.integers(1, len(data) + 2))).tolist()))
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


def test_matches_a_rescan_on_random_pieces():
    rng = np.random.default_rng()
    for _ in range(300):
        text = random_text(rng, int(rng.integers(1, 40)))
        stops = [random_text(rng, int(rng.integers(1, 5))) for _ in range(int(rng.integers(1, 5)))]
        if rng.random() < 0.5:  # one stop surely inside the text
            i = int(rng.integers(len(text)))
            stops.append(text[i:i + int(rng.integers(1, 6))])
        matcher, seen, found = StopMatcher(stops), "", -1
        for piece in pieces(rng, text.encode()):
            new, end = matcher.feed_bytes(piece)
            if end >= 0:
                found = len(seen) + end
                break
            seen += new
            assert matcher.pending == max((n for s in stops for n in range(1, len(s))
                                           if seen.endswith(s[:n])), default=0)
        want_end, want_length = first_completion(text, stops)
        assert found == want_end, (text, stops)
        if found >= 0:
            assert matcher.match_length == want_length


def lines_run(matcher: StopMatcher, text: str) -> int:
    """Lines of ``StopMatcher.feed`` executed while it reads ``text`` one character at a time
    (a count of work, counted by a trace function, independent of the machine's load)."""
    code = StopMatcher.feed.__code__
    count = 0

    def local(frame, event, arg):
        nonlocal count
        count += event == "line"
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is code else None

    sys.settrace(tracer)
    try:
        for c in text:
            assert matcher.feed(c) == -1
    finally:
        sys.settrace(None)
    return count


def test_cost_is_linear_in_the_text_with_the_most_and_longest_stops():
    """The hostile maximum (64 stop strings of 512 characters that keep almost matching, and
    texts that make every automaton fall back) costs a bounded number of operations per
    character and stop string at any length (amortized: a fall-back step is paid for by the
    step that advanced), never a rescan."""
    rng = np.random.default_rng()
    stops = ["a" * (MAX_STOP_LENGTH - 1) + c for c in random_text(rng, MAX_STOP_STRINGS).replace("a", "b")]
    runs = "x".join("a" * int(n) for n in rng.integers(1, MAX_STOP_LENGTH, 8))  # x: each automaton falls back
    for text in ("a" * 800, (runs * 2)[:800]):  # neither completes a stop string (each ends in another letter)
        work = [lines_run(StopMatcher(stops), text[:n]) / (n * len(stops)) for n in (200, 800)]
        assert max(work) <= 12, work  # bounded lines per character and stop string (a rescan: ~n / 2)
