"""The ``--grammar-*`` options of rwkv7-serve and rwkv7-generate: the bounds of
scheduler/grammar_limits.py ``GrammarLimits``, one flag per field, applied to the process."""
from __future__ import annotations

import argparse
from dataclasses import fields

from scheduler.grammar import set_limits
from scheduler.grammar_limits import GrammarLimits

HELP = {
    "max_bytes": "bytes of one schema, regex, grammar or choice list",
    "max_regex_size": "length of a regex (also a grammar's or a schema pattern's) with counted repetitions "
                      "written out",
    "max_depth": "nesting of a schema (its $refs followed), regex or grammar",
    "max_rules": "rules of a Lark grammar",
    "max_refs": "$refs on one path of a JSON schema",
    "max_choices": "entries of a choice list",
    "max_automaton_mb": "megabytes one compiled constraint may take",
    "step_items": "parser work (Earley items) of one row's mask in one step; a row over it fails",
    "cache_mb": "megabytes of compiled constraints kept",
}


def add_grammar_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("grammar limits (structured output; beyond one a request is refused, naming it)")
    for f in fields(GrammarLimits):
        g.add_argument(f"--grammar-{f.name.replace('_', '-')}", type=int, default=f.default, metavar="N",
                       help=f"most {HELP[f.name]} (default {f.default})")


def apply_grammar_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Set the process's grammar limits from the options (exit 2 naming a bad one)."""
    try:
        set_limits(GrammarLimits(**{f.name: getattr(args, f"grammar_{f.name}") for f in fields(GrammarLimits)}))
    except ValueError as e:
        p.error(str(e))
