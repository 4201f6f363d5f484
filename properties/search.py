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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, cast

from hypothesis import HealthCheck, Phase, Verbosity, given, settings, target
from hypothesis import example as hypothesis_example
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky
from hypothesis.strategies import SearchStrategy

from harness._checks import check_int, check_positive_int
from harness.adapters.protocol import HookNotObserved, ModelError
from harness.errors import AttnlabError
from properties.budget import Budget
from properties.precision import NOT_COMPARABLE, Noise, calibrating

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
    ``noise_floor``, ``allowance`` and ``ratio = worst / allowance`` say how close the verdict was
    (properties/precision.py): for a calibrated row they are those of the example with the largest
    ratio, and ``tolerance`` is that allowance; an exact or uncalibrated row has noise_floor NaN and
    allowance = tolerance.
    """

    property: str
    applicable: bool
    passed: Optional[bool]
    worst: float
    tolerance: float
    counterexample: str = ""
    status: str = ""
    reason: str = ""
    noise_floor: float = math.nan
    allowance: float = math.nan
    ratio: float = math.nan

    def __post_init__(self) -> None:
        derived = ("n/a" if not self.applicable else "unobservable" if self.passed is None
                   else "pass" if self.passed else "fail")
        if not self.status:
            object.__setattr__(self, "status", derived)
        elif self.status != derived:
            raise AttnlabError(f"status={self.status!r} is invalid for applicable={self.applicable}, "
                               f"passed={self.passed}: expected {derived!r}")
        if math.isnan(self.allowance) and self.applicable and self.passed is not None:
            object.__setattr__(self, "allowance", self.tolerance)
        if math.isnan(self.ratio) and not math.isnan(self.allowance):
            ratio = self.worst / self.allowance if self.allowance > 0 else (0.0 if self.worst == 0 else math.inf)
            object.__setattr__(self, "ratio", ratio)

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
           info: Callable[[], str] = lambda: "", noise: Optional[Noise] = None,
           drawn: Optional[list[tuple[float, Any]]] = None, replay: Optional[Sequence[Any]] = None,
           first: Sequence[Any] = (), budget: Optional[Budget] = None,
           memo: Optional[dict[str, tuple[float, float, float]]] = None
           ) -> PropertyResult:
    """Search ``strategy`` for an input whose ``measure(x)[0]`` exceeds its allowance.

    ``measure`` returns (deviation, where): the deviation (NaN counts as a failure) and a short
    note on where it occurred; ``describe`` turns an input into a short string; ``info()``, called
    at the end, becomes the row's ``reason``. Without ``noise`` the allowance is ``tolerance``;
    with it (a calibrated property, properties/precision.py) each example's allowance comes from
    its measured noise floor, and an example on which the check read a non-finite value makes the
    row unobservable ("not comparable"). A model that raises (:class:`ModelError`) fails the
    property; a hook that does not fire (:class:`HookNotObserved`) or an error in the check's own
    code makes it unobservable: the harness could not look, which says nothing about the model.

    ``drawn``, when given, receives ``(ratio, example)`` for every input measured. ``replay`` runs
    exactly those inputs, in order, and draws none (a failure is reported as drawn, not shrunk): the
    shadow run of a hidden-bug check replays on the golden twin what the model's own search drew,
    worst first, instead of searching anew (properties/registry.py). ``first`` are inputs measured before
    any drawn one, in every search but a replay (hypothesis's explicit examples): an input too costly to
    draw again and again, such as one row past a long window's edge.

    ``budget`` (properties/budget.py): once it is exhausted, the examples drawn after are not
    measured, until an input breaks the tolerance (its shrinking is never cut); the row's reason
    then says how many ran. ``memo`` keeps each measured input's (deviation, floor, allowance)
    by its description, so a budgeted row's second search does not measure again the
    simplest input its first one measured (registry.py).
    """
    check_search_args(seed, max_examples)
    calibrated = noise is not None and noise.calibrated
    # at the example with the largest ratio: (ratio, deviation, floor, allowance)
    worst = [(0.0, 0.0, 0.0 if calibrated else math.nan, noise.minimum if calibrated and noise else tolerance)]
    unobserved: list[str] = []
    failing = [False]  # an input broke the tolerance: hypothesis is shrinking it, every example is measured

    def prop(example: Any) -> None:
        if unobserved:  # nothing more can be seen; let the search end quickly
            return
        if budget is not None:
            if not failing[0] and budget.exhausted():  # the rest of the search is drawn, not measured
                budget.skipped += 1
                return
            budget.examples += 1
        known = memo.get(describe(example)) if memo is not None else None
        if known is not None:
            record(example, known[0], known[1], known[2])
            return
        if noise is not None:
            noise.start()
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
        if noise is not None and noise.nonfinite:
            unobserved.append(f"{NOT_COMPARABLE}: {noise.nonfinite} on input {describe(example)}")
            return
        deviation = float(deviation)
        if math.isnan(deviation):
            deviation = math.inf
        floor, allowance = (noise.example_floor(), noise.allowance()) if calibrated and noise else (math.nan, tolerance)
        record(example, deviation, floor, allowance, where)
        if memo is not None:  # it held (a failing input raised above): shrinking measures again what it replays
            memo[describe(example)] = (deviation, floor, allowance)

    def record(example: Any, deviation: float, floor: float, allowance: float, where: str = "") -> None:
        ratio = deviation / allowance if allowance > 0 else (0.0 if deviation == 0 else math.inf)
        if ratio >= worst[0][0]:
            worst[0] = (ratio, deviation, floor, allowance)
        if drawn is not None:
            drawn.append((ratio, example))
        target(min(ratio, 1e300), label=name)  # hill-climb towards larger deviations, in allowances
        if deviation > allowance:
            failing[0] = True
            raise Violation(deviation, f"{describe(example)}: {where}")

    def result(passed: bool, counterexample: str = "") -> PropertyResult:
        ratio, deviation, floor, allowance = worst[0]
        cut = budget.text() if budget is not None and passed else ""  # a failure's count would be its shrinking's
        reason = "; ".join(r for r in (info(), cut) if r)
        return PropertyResult(name, True, passed, deviation, allowance, counterexample, reason=reason,
                              noise_floor=floor, allowance=allowance, ratio=ratio)

    configured = settings(
        max_examples=max_examples or cast(settings, settings.default).max_examples,
        database=None,  # a property run must not read or write a project's example database
        deadline=None,
        derandomize=False,  # the seed decides
        phases=(Phase.explicit,) if replay is not None else (Phase.explicit, Phase.generate, Phase.target,
                                                              Phase.shrink),
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    test = given(strategy)(prop)
    explicit = list(replay if replay is not None else first)
    for example in reversed(explicit):  # @example stacks: the last applied runs first
        test = hypothesis_example(example)(test)
    test = configured(hypothesis_seed(seed)(test))
    # No example database (above), so no database key: without one given, hypothesis derives it from a digest of
    # the test function's source, read afresh for every search (~5% of a tiny model's check). hypothesis's own
    # `find` passes its key this way; its engine reads the key only where a database is set.
    test._hypothesis_internal_database_key = None  # type: ignore[attr-defined]
    try:
        with calibrating(noise):
            test()
    except Violation as v:  # hypothesis re-raises the shrunk (minimal) failing example last
        return result(False, v.description)
    except Flaky:  # the same input failed once and passed on replay: the model is not deterministic
        if unobserved:  # the replay stopped early because a hook went silent, not the model
            return PropertyResult.unobservable(name, tolerance, unobserved[0])
        return result(False, "non-deterministic: an input failed once and passed when replayed")
    if unobserved:
        return PropertyResult.unobservable(name, tolerance, unobserved[0])
    return result(True)
