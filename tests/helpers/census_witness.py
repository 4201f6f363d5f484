"""Witnesses for the census's findings (reports/census/findings.py FINDINGS), each independent of the property suite.

Each rebuilds the census's own tiny model (``reports.census.shrink.build``) and shows the bug on the
raw Hugging Face model; it raises AssertionError once the bug no longer reproduces.
"""

from __future__ import annotations

from reports.census.enumerate import by_name
from reports.census.shrink import build
from tests.helpers.zoo_witness import falcon_output_attentions_leaks_future


def _tiny(model_type: str):
    mt = by_name()[model_type]
    return build(mt.name, mt.class_name)


def falcon_census() -> str:
    """Falcon's eager branch under output_attentions=True adds sdpa's boolean mask to the scores (the zoo's finding)."""
    return falcon_output_attentions_leaks_future(_tiny("falcon"))


WITNESSES = {f.__name__: f for f in (falcon_census,)}
