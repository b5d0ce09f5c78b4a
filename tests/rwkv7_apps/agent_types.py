"""Closed output types the agent-client tests share: a random-weight model rarely closes
free-form JSON, so every value is an enum or a literal."""
from __future__ import annotations

from typing import Literal

import pydantic

CITIES = ("Oslo", "Paris", "Rome")


class Verdict(pydantic.BaseModel):
    """A verdict."""
    model_config = pydantic.ConfigDict(extra="forbid")
    mood: Literal["good", "bad"]
    score: Literal[1, 2, 3]
