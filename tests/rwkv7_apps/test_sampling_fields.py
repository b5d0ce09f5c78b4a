"""The numeric sampling fields are declared once (``rwkv7_core.sampling.SCALAR_FIELDS``):
the commands' options, the server's request fields and the validation all follow them."""
from __future__ import annotations

import argparse

import numpy as np
import pydantic
import pytest

from rwkv7_apps.options import COMMAND_DEFAULTS, SAMPLING_OPTIONS, add_sampling_options
from rwkv7_apps.serve.protocol import ChatCompletionRequest, CompletionRequest
from rwkv7_apps.serve.responses_protocol import SAMPLING, ResponseRequest
from rwkv7_core.sampling import SCALAR_FIELDS, SamplingFieldError, SamplingParams


def _outside(spec, rng) -> list:
    """Values just past each bound the field has."""
    step = float(rng.uniform(0.01, 3)) if spec.kind is float else int(rng.integers(1, 5))
    low = spec.ge if spec.ge is not None else spec.gt
    out = [] if low is None else [low - step] + ([low] if spec.gt is not None else [])
    return out + ([] if spec.le is None else [spec.le + step])


def _inside(spec, rng):
    low = spec.ge if spec.ge is not None else spec.gt if spec.gt is not None else -10
    high = spec.le if spec.le is not None else low + 100
    if spec.kind is int:
        return int(rng.integers(int(low) + (spec.gt is not None), int(min(high, low + 1000)) + 1))
    return float(rng.uniform(low, high)) if spec.gt is None else float(high)


@pytest.mark.parametrize("spec", SCALAR_FIELDS, ids=lambda s: s.name)
def test_each_field_has_its_option_request_field_and_bounds(spec):
    rng = np.random.default_rng()
    parser = argparse.ArgumentParser()
    add_sampling_options(parser, "the input")
    flag = "--" + spec.name.replace("_", "-")
    assert spec.name in SAMPLING_OPTIONS
    default = vars(parser.parse_args([]))[spec.name]
    assert default == COMMAND_DEFAULTS.get(spec.name, getattr(SamplingParams(), spec.name))
    good = _inside(spec, rng)
    assert vars(parser.parse_args([flag, str(good)]))[spec.name] == good
    SamplingParams(**{spec.name: good}).validate()
    for model in (CompletionRequest, ChatCompletionRequest):
        base = {"prompt": [1]} if model is CompletionRequest else {"messages": [{"role": "user", "content": "x"}]}
        assert getattr(model(**base, **{spec.name: good}), spec.name) == good
        for bad in _outside(spec, rng):
            with pytest.raises(pydantic.ValidationError, match=spec.name):
                model(**base, **{spec.name: bad})
    for bad in _outside(spec, rng):
        with pytest.raises(SamplingFieldError) as caught:
            SamplingParams(**{spec.name: bad}).validate()
        assert caught.value.field == spec.name and caught.value.why == spec.rule


def test_the_responses_request_carries_a_subset_under_the_same_bounds():
    rng = np.random.default_rng()
    assert set(SAMPLING) <= {s.name for s in SCALAR_FIELDS} and "top_p" in SAMPLING
    for spec in SCALAR_FIELDS:
        if spec.name in SAMPLING:
            for bad in _outside(spec, rng):
                with pytest.raises(pydantic.ValidationError):
                    ResponseRequest(input="x", **{spec.name: bad})
