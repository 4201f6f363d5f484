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
from harness.adapters.protocol import HookNotObserved, ModelError
from harness.errors import AttnlabError

STATUSES = ("pass", "fail", "n/a", "unobservable")


@dataclass(frozen=True)
class PropertyResult:
    """One row of :func:`properties.check_model`'s table.

    ``status`` is one of :data:`STATUSES`: **pass**, **fail** (``counterexample`` is the shrunk
    input that broke it), **n/a** (the property does not apply to this design) or
    **unobservable** (it applies, but a hook it needs does not exist or never fires on this
    model, or the harness's own code failed to read it; ``reason`` names the hook). ``reason``
    also carries information on pass/fail rows (e.g. the measured attention scale).
    ``applicable``/``passed`` are kept for older readers: n/a is (False, None), unobservable
    (True, None). ``worst`` is the largest deviation seen (NaN when nothing was measured), in
    the unit the property's docstring gives. ``status`` is derived when left empty.
    """

    property: str
    applicable: bool
    passed: Optional[bool]
    worst: float
    tolerance: float
    counterexample: str = ""
    status: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        derived = ("n/a" if not self.applicable else "unobservable" if self.passed is None
                   else "pass" if self.passed else "fail")
        if not self.status:
            object.__setattr__(self, "status", derived)
        elif self.status != derived:
            raise AttnlabError(f"status={self.status!r} is invalid for applicable={self.applicable}, "
                               f"passed={self.passed}: expected {derived!r}")

    @classmethod
    def not_applicable(cls, name: str, tolerance: float, reason: str = "") -> PropertyResult:
        return cls(name, False, None, math.nan, tolerance, "", reason=reason)

    @classmethod
    def unobservable(cls, name: str, tolerance: float, reason: str) -> PropertyResult:
        return cls(name, True, None, math.nan, tolerance, "", reason=reason)


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


# How the common inputs read in a counterexample: tokens, (tokens, mask or None), (tokens, offset).
def tokens_text(x: Any) -> str:
    return f"tokens={x.tolist()}"


def masked_text(example: Any) -> str:
    x, mask = example
    return f"tokens={x.tolist()}" + ("" if mask is None else f" mask={mask.tolist()}")


def offset_text(example: Any) -> str:
    x, offset = example
    return f"tokens={x.tolist()} position_offset={offset}"


def search(name: str, tolerance: float, strategy: SearchStrategy, measure: Measure,
           describe: Callable[[Any], str], *, seed: int, max_examples: Optional[int],
           info: Callable[[], str] = lambda: "") -> PropertyResult:
    """Search ``strategy`` for an input with ``measure(x)[0] > tolerance``.

    ``measure`` returns (deviation, where): the deviation (NaN counts as a failure) and a short
    note on where it occurred; ``describe`` turns an input into a short string; ``info()``, called
    at the end, becomes the row's ``reason``. A model that raises (:class:`ModelError`) fails the
    property; a hook that does not fire (:class:`HookNotObserved`) or an error in the check's own
    code makes it unobservable: the harness could not look, which says nothing about the model.
    """
    check_search_args(seed, max_examples)
    worst = [0.0]
    unobserved: list[str] = []

    def prop(example: Any) -> None:
        if unobserved:  # nothing more can be seen; let the search end quickly
            return
        try:
            deviation, where = measure(example)
        except HookNotObserved as exc:
            unobserved.append(f"{exc.reason} (input {describe(example)})")
            return
        except ModelError as exc:  # a model that crashes on a valid protocol input fails the property
            deviation, where = math.inf, f"raised {type(exc.original).__name__}: {exc.original}"
        except Exception as exc:  # the check's own code failed on what the model's hooks returned
            unobserved.append(f"the check could not read the model: {type(exc).__name__}: {exc}")
            return
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
        return PropertyResult(name, True, False, worst[0], tolerance, v.description, reason=info())
    except Flaky:  # the same input failed once and passed on replay: the model is not deterministic
        if unobserved:  # the replay stopped early because a hook went silent, not the model
            return PropertyResult.unobservable(name, tolerance, unobserved[0])
        return PropertyResult(name, True, False, worst[0], tolerance,
                              "non-deterministic: an input failed once and passed when replayed", reason=info())
    if unobserved:
        return PropertyResult.unobservable(name, tolerance, unobserved[0])
    return PropertyResult(name, True, True, worst[0], tolerance, "", reason=info())
