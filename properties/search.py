"""One property = one hypothesis search for an input whose deviation exceeds a tolerance.

:func:`search` runs ``measure`` on inputs drawn from a strategy, records the largest
deviation seen, steers the search towards large deviations (``hypothesis.target``) and,
when an input breaks the tolerance, lets hypothesis shrink it to a minimal one, whose
description becomes the ``counterexample``. The search is seeded by ``seed`` (which
overrides the profile's derandomization), so a result is reproducible; ``max_examples``
defaults to the loaded hypothesis profile's (``ci`` 25, ``dev`` 50, ``thorough`` 500).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, cast

from hypothesis import HealthCheck, Phase, Verbosity, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky
from hypothesis.strategies import SearchStrategy

from harness._checks import check_int, check_positive_int


@dataclass(frozen=True)
class PropertyResult:
    """One row of :func:`properties.check_model`'s table.

    ``worst`` is the largest deviation seen (NaN when not applicable), in the unit the
    property's docstring gives; ``passed`` is None when the property does not apply.
    """

    property: str
    applicable: bool
    passed: Optional[bool]
    worst: float
    tolerance: float
    counterexample: str = ""

    @classmethod
    def not_applicable(cls, name: str, tolerance: float) -> PropertyResult:
        return cls(name, False, None, math.nan, tolerance, "")


class Violation(Exception):
    """Raised inside the search when an input breaks the tolerance (caught by :func:`search`)."""

    def __init__(self, deviation: float, description: str):
        super().__init__(description)
        self.deviation = deviation
        self.description = description


def check_search_args(seed: Any, max_examples: Any) -> None:
    check_int("seed", seed, 0)
    check_positive_int("max_examples", max_examples, none_ok=True)


Measure = Callable[[Any], tuple[float, str]]


def search(name: str, tolerance: float, strategy: SearchStrategy, measure: Measure,
           describe: Callable[[Any], str], *, seed: int, max_examples: Optional[int]) -> PropertyResult:
    """Search ``strategy`` for an input with ``measure(x)[0] > tolerance``.

    ``measure`` returns (deviation, where): the deviation (NaN counts as a failure) and a short
    note on where it occurred; ``describe`` turns an input into a short string.
    """
    check_search_args(seed, max_examples)
    worst = [0.0]

    def prop(example: Any) -> None:
        try:
            deviation, where = measure(example)
        except Exception as exc:  # a model that crashes on a valid protocol input fails the property
            deviation, where = math.inf, f"raised {type(exc).__name__}: {exc}"
        deviation = float(deviation)
        if math.isnan(deviation):
            deviation = math.inf
        worst[0] = max(worst[0], deviation)
        target(min(deviation, 1e300), label=name)  # hill-climb towards larger deviations
        if deviation > tolerance:
            raise Violation(deviation, f"{describe(example)}: {where}")

    configured = settings(
        max_examples=max_examples or cast(settings, settings.default).max_examples,
        database=None,  # a property run must not read or write a project's example database
        deadline=None,
        derandomize=False,  # the seed decides
        phases=(Phase.explicit, Phase.generate, Phase.target, Phase.shrink),
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    test = configured(hypothesis_seed(seed)(given(strategy)(prop)))
    try:
        test()
    except Violation as v:  # hypothesis re-raises the shrunk (minimal) failing example last
        return PropertyResult(name, True, False, worst[0], tolerance, v.description)
    except Flaky:  # the same input failed once and passed on replay: the model is not deterministic
        return PropertyResult(name, True, False, worst[0], tolerance,
                              "non-deterministic: an input failed once and passed when replayed")
    return PropertyResult(name, True, True, worst[0], tolerance, "")
