"""A radix tree over token sequences: the prefix cache's index of its cached boundaries.

``longest_prefix(tokens)`` is the length of the longest member that is a prefix of
``tokens`` (one walk down the tree, at most len(tokens) token comparisons, however many
members); edges carry runs of tokens, so a tree of n members has at most 2n nodes.
"""
from __future__ import annotations

from typing import Sequence


class _Node:
    __slots__ = ("edges", "end")

    def __init__(self):
        self.edges: dict[int, list] = {}  # first token -> [token run (tuple), child node]
        self.end = False                  # a member ends here


class TokenRadix:
    """A set of non-empty token tuples (see the module docstring). Not thread-safe."""

    def __init__(self):
        self._root = _Node()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, key: Sequence[int]) -> None:
        key = tuple(key)
        node, i = self._root, 0
        while i < len(key):
            edge = node.edges.get(key[i])
            if edge is None:
                node.edges[key[i]] = [key[i:], _Node()]
                node = node.edges[key[i]][1]
                break
            run, child = edge
            common = _common(run, key, i)
            if common < len(run):  # split the edge where the key leaves it
                middle = _Node()
                middle.edges[run[common]] = [run[common:], child]
                edge[0], edge[1] = run[:common], middle
                child = middle
            node, i = child, i + common
        if not node.end:
            node.end = True
            self._size += 1

    def remove(self, key: Sequence[int]) -> None:
        """Take ``key`` out (a no-op when it is not a member)."""
        key = tuple(key)
        path, node, i = [], self._root, 0
        while i < len(key):
            edge = node.edges.get(key[i])
            if edge is None or key[i:i + len(edge[0])] != edge[0]:
                return
            path.append((node, key[i]))
            node, i = edge[1], i + len(edge[0])
        if not node.end or not path:
            return
        node.end = False
        self._size -= 1
        for parent, first in reversed(path[-2:]):  # the emptied node, then its parent
            _compact(parent, first)

    def longest_prefix(self, tokens: Sequence[int]) -> int:
        """Length of the longest member that is a prefix of ``tokens`` (0: none)."""
        tokens = tuple(tokens)
        node, i, best = self._root, 0, 0
        while True:
            if node.end:
                best = i
            edge = node.edges.get(tokens[i]) if i < len(tokens) else None
            if edge is None or tokens[i:i + len(edge[0])] != edge[0]:
                return best
            node, i = edge[1], i + len(edge[0])


def _common(run: tuple, key: tuple, start: int) -> int:
    """How many leading tokens of ``run`` equal ``key[start:]``'s."""
    n = min(len(run), len(key) - start)
    if key[start:start + n] == run[:n]:
        return n
    k = 0
    while run[k] == key[start + k]:
        k += 1
    return k


def _compact(parent: _Node, first: int) -> None:
    """Drop the child on ``parent``'s edge ``first`` when it is empty, or merge it into that
    edge when it has one edge and ends no member."""
    edge = parent.edges[first]
    node = edge[1]
    if node.end:
        return
    if not node.edges:
        del parent.edges[first]
    elif len(node.edges) == 1:
        (run, child), = node.edges.values()
        edge[0], edge[1] = edge[0] + run, child
