"""The property registry: a property registers itself; the suite, the exports and the docs table read it.

Like hypothesis's ``@defines_strategy`` or transformers' ``AttentionInterface``, a check is one
decorated function in one module (``properties/checks/<module>.py``); nothing else lists it.
:data:`properties.PROPERTIES` (report order), ``properties.__all__``, ``properties.checks.__all__``
and docs/properties.md (``python -m properties.doc --write docs/properties.md``) are derived from
:data:`REGISTRY`.

Two kinds of property:

- **model** properties (:func:`model_property`) check a model through the protocol and are the
  rows of :func:`properties.check_model`, in ``order``. The decorator does the set-up every
  check shares, once: the search arguments and the protocol's forward/cfg part are checked; a
  design the property does not apply to gives **n/a** (``applies``); a design field the check
  needs that the model leaves undeclared (``declares``), a hook it ``needs`` that does not exist
  or never fires, give **unobservable** naming it; then the body returns a :class:`Plan` and the
  search (:func:`properties.search.search`) keeps the worst deviation and shrinks a failure.
- **component** properties (:func:`component_property`) check a formula, not a model (the
  rotary and sinusoidal functions of ``harness.model.positions`` or a drop-in replacement):
  they are exported and in the docs table, but not rows of the suite.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union, cast

from hypothesis import settings
from hypothesis.strategies import SearchStrategy

from harness.adapters.dispatch import NO_TWIN, is_dispatched
from harness.adapters.protocol import ATTENTION_DIRS, POSITIONAL_TYPES, check_protocol, observed_hooks
from harness.errors import AttnlabError
from properties.budget import Budget, budgeted
from properties.cost import counting
from properties.design import model_dtype
from properties.precision import HIDDEN, coarse, golden_twin, noise_for
from properties.precision import RULE as MEASURED_RULE
from properties.search import Measure, PropertyResult, check_search_args, search, tokens_text

KINDS = ("model", "component")
Check = Callable[..., PropertyResult]
Tolerance = Union[float, Callable[[Any], float]]
Needs = Union[tuple[str, ...], Callable[[Any], tuple[str, ...]]]


@dataclass(frozen=True)
class Plan:
    """What a check body hands the search: inputs, the measurement, how an input reads, the row's reason."""

    strategy: SearchStrategy
    measure: Measure
    describe: Callable[[Any], str] = tokens_text
    info: Callable[[], str] = lambda: ""
    tokens: int = 0  # the longest input it measures, where that is long enough to price (properties/budget.py)
    first: tuple[Any, ...] = ()  # inputs measured before any drawn one, once a search (properties/search.py)


@dataclass(frozen=True)
class Applies:
    """The designs a model property applies to; on any other it is n/a.

    ``reason`` is the n/a row's reason, a ``str.format`` template over ``cfg``
    (``"attention_dir={cfg.attention_dir!r}"``). ``when(model)`` is a further condition: it returns
    None when it holds, else the n/a reason; ``when_doc`` says it in words for the docs table.
    """

    positional: tuple[str, ...] = POSITIONAL_TYPES
    attention: tuple[str, ...] = ATTENTION_DIRS
    min_ctx: int = 1
    min_vocab: int = 1
    reason: str = ""
    when: Optional[Callable[[Any], Optional[str]]] = None
    when_doc: str = ""

    def __post_init__(self) -> None:
        unknown = [p for p in self.positional if p not in POSITIONAL_TYPES]
        unknown += [a for a in self.attention if a not in ATTENTION_DIRS]
        if unknown or (self.when is None) != (not self.when_doc):
            raise AttnlabError(f"Applies(positional={self.positional!r}, attention={self.attention!r}, when_doc="
                               f"{self.when_doc!r}) is invalid: expected values from {POSITIONAL_TYPES} and "
                               f"{ATTENTION_DIRS}, and when_doc exactly when when is given")

    def not_applicable(self, model: Any) -> Optional[str]:
        """None when ``model`` has a design this applies to, else the n/a row's reason."""
        cfg = model.cfg
        if (cfg.positional_embedding_type not in self.positional or cfg.attention_dir not in self.attention
                or cfg.n_ctx < self.min_ctx or cfg.d_vocab < self.min_vocab):
            return self.reason.format(cfg=cfg)
        return None if self.when is None else self.when(model)

    def text(self) -> str:
        parts = []
        if self.positional != POSITIONAL_TYPES:
            parts.append("positional " + " / ".join(self.positional))
        if self.attention != ATTENTION_DIRS:
            parts.append(" / ".join(self.attention))
        parts += [f"{f} >= {v}" for f, v in (("n_ctx", self.min_ctx), ("d_vocab", self.min_vocab)) if v > 1]
        if self.when_doc:
            parts.append(self.when_doc)
        return "; ".join(parts) or "every model"


@dataclass(frozen=True)
class Property:
    """One registered property: its public check and what the docs table says of it."""

    name: str
    kind: str
    order: int
    check: Check
    module: str
    summary: str
    applies_to: str
    hooks_text: str
    tolerance_text: str
    applies: Optional[Applies] = None


@dataclass
class Case:
    """What a model property's body gets: the model, its cfg and the hooks it needs, resolved in order."""

    model: Any
    hooks: tuple[str, ...]
    given_observed: Optional[set[str]] = field(default=None, repr=False)

    @property
    def cfg(self) -> Any:
        return self.model.cfg

    @functools.cached_property
    def observed(self) -> set[str]:
        """The hook points that fire (computed once, only if a check asks; check_model passes its own)."""
        return observed_hooks(self.model) if self.given_observed is None else set(self.given_observed)


REGISTRY: dict[str, Property] = {}


def register(prop: Property) -> None:
    """Add ``prop``; a name already taken, or an order another property of its kind holds, is an error."""
    if prop.kind not in KINDS:
        raise AttnlabError(f"kind={prop.kind!r} is invalid: expected one of {KINDS}")
    clash = [p.name for p in REGISTRY.values() if p.name == prop.name
             or (p.kind == prop.kind and p.order == prop.order)]
    if clash:
        raise AttnlabError(f"property {prop.name!r} (order {prop.order}, {prop.module}) clashes with {clash[0]!r} "
                           f"({REGISTRY[clash[0]].module}): expected a new name and an order no other "
                           f"{prop.kind} property holds")
    REGISTRY[prop.name] = prop


def registered(kind: Optional[str] = None) -> list[Property]:
    """The registered properties (of ``kind``), model properties first, each kind in its ``order``."""
    props = sorted(REGISTRY.values(), key=lambda p: (KINDS.index(p.kind), p.order))
    return [p for p in props if kind is None or p.kind == kind]


def names() -> list[str]:
    """Every registered check's name: the exports of ``properties`` and ``properties.checks``."""
    return [p.name for p in registered()]


def check(name: str) -> Check:
    """The registered check called ``name`` (AttributeError otherwise: a module's ``__getattr__`` uses this)."""
    if name not in REGISTRY:
        raise AttributeError(f"no property {name!r}: expected one of {names()}")
    return REGISTRY[name].check


class SuiteProperties(Mapping[str, Check]):
    """name -> check of every model property, in report order; a live view, so a new property shows at once."""

    def __getitem__(self, name: str) -> Check:
        prop = REGISTRY.get(name)
        if prop is None or prop.kind != "model":
            raise KeyError(name)
        return prop.check

    def __iter__(self) -> Iterator[str]:
        return iter([p.name for p in registered("model")])

    def __len__(self) -> int:
        return len(registered("model"))

    def __repr__(self) -> str:
        return f"SuiteProperties({list(self)})"


SUITE = SuiteProperties()


def summary_line(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    if not doc.strip():
        raise AttnlabError(f"{fn.__module__}.{fn.__name__} has no docstring: expected its first line to say "
                           "what the property checks (the docs table shows it)")
    return doc.strip().splitlines()[0]


def hook_gap(model: Any, names: tuple[str, ...] | list[str], observed: set[str]) -> Optional[str]:
    """Why a check needing hooks ``names`` cannot look at ``model`` (None when every one fires)."""
    for name in names:
        if name not in model.hook_dict:
            return f"no hook point {name}"
        if name not in observed:
            return f"hook {name} exists but never fires on this model"
    return None


def _expand(templates: tuple[str, ...], n_layers: int) -> list[str]:
    """Hook templates over layers (``{layer}``: every layer, layer-major), duplicates dropped."""
    out = [t.format(layer=layer) for layer in range(n_layers) for t in templates]
    return list(dict.fromkeys(out))


def _resolve(case_model: Any, wanted: list[str], observed: Callable[[], set[str]]) -> tuple[tuple[str, ...], str]:
    """Pick the first firing alternative of each ``a|b`` entry; (hooks, why it cannot look or "")."""
    hooks = []
    for entry in wanted:
        options = entry.split("|")
        if len(options) == 1:
            hooks.append(entry)
            continue
        chosen = next((o for o in options if o in observed()), options[-1])
        gap = hook_gap(case_model, [chosen], observed())
        if gap:
            return (), f"needs {' or '.join(o.split('.')[-1] for o in options)}: {gap}"
        hooks.append(chosen)
    if hooks:
        gap = hook_gap(case_model, hooks, observed())
        if gap:
            return (), gap
    return tuple(hooks), ""


def model_property(*, name: str, order: int, tolerance: Tolerance, rule: str, applies: Applies = Applies(),
                   needs: Needs = (), needs_doc: str = "", declares: tuple[str, ...] = (),
                   calibrated: bool = False, local_floor: bool = False, twin_replay: bool = False,
                   judges_nonfinite: bool = False) -> Callable[..., Check]:
    """Register the decorated ``body(case: Case) -> Plan`` as the model property ``name``.

    Returns the public check ``check(model, *, seed=0, max_examples=None, observed=None) -> PropertyResult``;
    ``max_examples=None`` runs the profile's count within the row's pass budget (properties/budget.py).
    ``tolerance``: a number, or a function of the model (e.g. of its dtype); ``rule`` says in words
    how it is set. ``needs``: hook names, ``{layer}`` for every layer, ``a|b`` for the first of
    two that fires; or a function of cfg returning them (then ``needs_doc`` says which in words).
    ``declares``: cfg fields that, present but None (an adapter could not read them), leave the
    check without a reference: unobservable.
    ``calibrated``: a numeric property whose allowance is measured per example from the model's
    rounding noise against a float64 twin (properties/precision.py); ``tolerance`` is then the
    fallback for a model no twin can be made of. Exact properties leave it False.
    ``twin_replay``: a row whose allowance is its own, derived from the dtype (not measured), whose pass on a
    bfloat16/float16 model is replayed on the golden twin as a calibrated row's is, so a bug under the rounding is
    reported hidden rather than missed.
    ``local_floor``: the check compares tensors of one forward pass with each other (a row sum, a
    score against its q.k), so its floor is one layer's rounding: the twin starts every layer
    from the model's own layer input (properties/precision.py).
    Every property but one reads a non-finite value as "not comparable" (unobservable, pointing to
    finite_outputs) rather than as an infinite deviation: an overflow is one finding with one name.
    ``judges_nonfinite`` marks the one whose verdict non-finite values are (finite_outputs).
    """
    if callable(needs) and not needs_doc:
        raise AttnlabError(f"property {name!r}: needs is a function, so needs_doc must say which hooks in words")

    def decorate(body: Callable[[Case], Plan]) -> Check:
        def check(model: Any, *, seed: int = 0, max_examples: Optional[int] = None,
                  observed: Optional[set[str]] = None) -> PropertyResult:
            return run(model, seed, max_examples, observed, shadow=False)

        def run(model: Any, seed: int, max_examples: Optional[int], observed: Optional[set[str]], *,
                shadow: bool, replay: Optional[list[Any]] = None) -> PropertyResult:
            check_search_args(seed, max_examples)
            # the smoke pass once: a caller that hands ``observed`` (check_model, a shadow run) already ran it
            check_protocol(model, hooks=False, forward=observed is None)
            tol = tolerance(model) if callable(tolerance) else tolerance
            reason = applies.not_applicable(model)
            if reason is not None:
                return PropertyResult.not_applicable(name, tol, reason)
            undeclared = [f for f in declares if hasattr(model.cfg, f) and getattr(model.cfg, f) is None]
            if undeclared:
                return PropertyResult.unobservable(name, tol, f"the model does not declare cfg.{undeclared[0]}")
            case = Case(model, (), observed)
            wanted = needs(model.cfg) if callable(needs) else _expand(needs, model.cfg.n_layers)
            hooks, gap = _resolve(model, list(wanted), lambda: case.observed)
            if gap:
                return PropertyResult.unobservable(name, tol, gap)
            case.hooks = hooks
            plan = body(case)
            # every check but finite_outputs watches for non-finite reads; a calibrated one also measures its
            # floor, except on a shadow run (the golden twin judged by the declared float32 tolerance)
            watch = None if judges_nonfinite else noise_for(model, measured=calibrated and not shadow,
                                                             local=local_floor)
            drawn: list[tuple[float, Any]] = []
            searching = functools.partial(search, name, tol, plan.strategy, plan.measure, plan.describe, seed=seed,
                                          info=plan.info, noise=watch, drawn=drawn, replay=replay,
                                          first=plan.first)
            # max_examples left to the suite: a big model's passes are budgeted by its size (properties/budget.py)
            planned = max_examples or cast(settings, settings.default).max_examples
            budget = Budget.of(model, planned, plan.tokens) if budgeted(max_examples) and not shadow else None
            if budget is None:
                result = searching(max_examples=max_examples)
            else:
                result = _budgeted(searching, model, budget)
            golden = watch.golden if watch is not None and watch.measured else None
            if twin_replay and not shadow and result.status == "pass" and coarse(model):
                golden = golden_twin(model)
            if not shadow and golden is not None and result.status == "pass" and coarse(model) and drawn:
                # the twin replays what this search drew, worst ratio first: no new search, no shrinking
                twin = run(golden, seed, max_examples, case.given_observed, shadow=True,
                           replay=_worst_first(drawn, plan.describe))
                result = _shadowed(result, twin, model_dtype(model))
            if calibrated and not shadow and is_dispatched(model):
                result = dataclasses.replace(result, reason="; ".join(r for r in (NO_TWIN, result.reason) if r))
            return result

        # the body's name, module and docstring; the signature stays the public check's (no __wrapped__)
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(check, attr, getattr(body, attr))
        hooks_text = needs_doc if callable(needs) else (
            needs_doc or ", ".join(n.replace("|", " or ") for n in needs) or "none (outputs only)")
        register(Property(name, "model", order, check, body.__module__, summary_line(body), applies.text(),
                          hooks_text, (f"{MEASURED_RULE}; with no twin, " if calibrated else "")
                          + _tolerance_text(tolerance, rule), applies))
        return check

    return decorate


def _budgeted(searching: Callable[..., PropertyResult], model: Any, budget: Budget) -> PropertyResult:
    """A search of as many examples as ``budget`` pays for, priced by its first: the simplest input alone.

    Hypothesis plans a search by its size (under 10 examples it draws at random from the first on;
    from 10 on, its first examples are zero-extended ones, such as a batch of identical all-zero rows),
    so the count is chosen before the search rather than the search cut short: a budgeted search is
    the one hypothesis runs at that count. The simplest input's measurement is kept (``memo``) and not
    repeated when the second search draws it first; a failure on it is the row's result, shrunk.
    """
    memo: dict[str, tuple[float, float, float]] = {}
    with counting(model) as cost:
        budget.cost = cost
        first = searching(max_examples=1, memo=memo)
        if first.status != "pass":
            return first
        return searching(max_examples=budget.examples_for(budget.spent()), memo=memo, budget=budget)


def _worst_first(drawn: list[tuple[float, Any]], describe: Callable[[Any], str]) -> list[Any]:
    """The inputs a search measured, each once, by their ratio to the allowance, largest first."""
    seen: dict[str, tuple[float, Any]] = {}
    for ratio, example in drawn:
        key = describe(example)
        if key not in seen or ratio > seen[key][0]:
            seen[key] = (ratio, example)
    return [example for _, example in sorted(seen.values(), key=lambda pair: -pair[0])]


def _shadowed(result: PropertyResult, golden: PropertyResult, dtype: Any) -> PropertyResult:
    """``result`` with a note when the same check fails on the model's golden twin: a bug that hides under rounding.

    The twin runs the same code at float64 (or float32: properties/precision.py) and is judged by the
    property's declared float32 tolerance, not by float64's rounding: modeling code computes parts in
    float32 whatever the weights' dtype (rotary phases, softmax upcasts), so a correct twin is only
    float32-exact there, and the declared tolerances are what correct float32 models meet (the zoo).
    A deviation past them is in the code, and only the coarse rounding of ``dtype`` kept it under this
    row's allowance. The row stays a pass at ``dtype`` (its verdict is about the numbers this model
    computes) and says what its copy shows, so the bug is not missed silently.
    """
    if golden.status != "fail":
        return result
    note = (f"{HIDDEN} ({str(dtype).removeprefix('torch.')}): its golden copy fails it, worst {golden.worst:.3g} > "
            f"allowance {golden.allowance:.3g}: {golden.counterexample}")
    return dataclasses.replace(result, reason="; ".join(r for r in (note, result.reason) if r))


def component_property(*, name: str, order: int, tolerance: float, rule: str, applies_to: str) -> Callable[..., Check]:
    """Register the decorated ``body(*args, **kw) -> Plan`` as the component property ``name``.

    The public check takes the body's arguments plus keyword-only ``seed`` and ``max_examples``;
    the body validates its own arguments first. Component properties are not rows of the suite.
    """

    def decorate(body: Callable[..., Plan]) -> Check:
        @functools.wraps(body)
        def check(*args: Any, seed: int = 0, max_examples: Optional[int] = None, **kw: Any) -> PropertyResult:
            plan = body(*args, **kw)
            return search(name, tolerance, plan.strategy, plan.measure, plan.describe, seed=seed,
                          max_examples=max_examples, info=plan.info)

        sig = inspect.signature(body)
        extra = [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a)
                 for p, d, a in (("seed", 0, int), ("max_examples", None, Optional[int]))]
        check.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra],  # type: ignore[attr-defined]
                                          return_annotation=PropertyResult)
        register(Property(name, "component", order, check, body.__module__, summary_line(body), applies_to,
                          "none (a formula, not a model)", _tolerance_text(tolerance, rule)))
        return check

    return decorate


def _tolerance_text(tolerance: Tolerance, rule: str) -> str:
    if not rule.strip():
        raise AttnlabError("rule='' is invalid: expected a sentence on how the tolerance is set")
    return rule if callable(tolerance) else f"{tolerance:g}: {rule}"
