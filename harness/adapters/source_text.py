"""The source text of a modeling module, class or function, read once per object.

The design facts (hf_design.py) and routes (hf_routes.py) are read off the modeling code's source. Every
adapter reads them again (the model, its float64 twin, each census variant), and ``inspect.getsource`` of a
function tokenizes its file's lines afresh each time; the text of an imported object does not change while
the process runs, so it is read once.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.cache
def source(obj: Any) -> str:
    """``inspect.getsource(obj)``, cached per object; raises what it raises (OSError, TypeError), uncached."""
    return inspect.getsource(obj)
