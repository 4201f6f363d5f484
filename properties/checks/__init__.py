"""The property checks: one module per property, each registering itself (:mod:`properties.registry`).

Importing this package imports every public module in it, so that each registers its property;
a module whose name starts with "_" is a shared helper and registers none. ``__all__`` and the
check attributes (``properties.checks.causal_pattern``) are read from the registry. A module is
named for its idea, never after its property (``cache.py`` registers ``kv_cache``), so that
``properties.checks.kv_cache`` has one meaning: the check.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from properties import registry

MODULES = tuple(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
for _module in MODULES:
    importlib.import_module(_module)
__all__ = registry.names()  # the attributes are looked up in the registry, so a later property is one at once


def __getattr__(name: str) -> Any:
    return registry.check(name)


def __dir__() -> list[str]:
    return sorted({*globals(), *registry.names()})
