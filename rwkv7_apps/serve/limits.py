"""Bounds on what one request may make the server hold.

``Metadata``: a request's ``metadata`` as OpenAI bounds it (at most 16 pairs, keys of at most
64 characters, values of at most 512), so a stored response cannot carry an unbounded object.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictStr, StringConstraints

METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512

Metadata = Annotated[dict[Annotated[StrictStr, StringConstraints(max_length=METADATA_KEY_CHARS)],
                          Annotated[StrictStr, StringConstraints(max_length=METADATA_VALUE_CHARS)]],
                     Field(max_length=METADATA_PAIRS)]
