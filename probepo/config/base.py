"""The base every configuration model shares."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown fields are errors (a typo in a preset must not be silently ignored), and a config is
    immutable (a run's recipe is frozen in the store): derive a changed one with `with_overrides`."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)
