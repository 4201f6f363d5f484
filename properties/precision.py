"""Precision-calibrated allowances: the one owner of how a numeric property's allowance is set.

The rule. A numeric property compares two computations that are equal in exact arithmetic
(batched vs alone, padded vs unpadded, a score vs ``scale * q.k`` ...). At the model's own dtype
they differ by rounding; a bug makes them differ by more. For every example the search draws,
each forward pass of the check (:func:`forward_capture`) also runs on a **float64 golden twin**
of the model (same weights, upcast), and the **noise floor** of that example is the worst scaled
deviation ``max|own - golden| / max|golden|`` (:func:`scaled_gap`; the logits' over
``max(1, max|golden|)``, their checks' unit) of any tensor the check read (the logits and every
captured activation) from its golden twin. The **allowance** is::

    allowance = max(FACTOR * floor, FACTOR * u64 * reduction)

Derivation of ``FACTOR = 4``. For a check whose deviation is ``d(a, b)`` of two tensors it read,
the triangle inequality gives ``d(a, b) <= d(a, a64) + d(b, b64) + d(a64, b64) <= 2 floor + d64``
(the checks scale by ``max(1, max|.|)``, at least the floor's ``max|.|``): rounding alone can
never move it past twice the floor, and ``d64``, the golden twin's own deviation (~1e-15 for a
correct model), is where a bug lives. A bug is in both copies, so it is not in the floor. 2
covers the two sides; the second factor of 2 covers checks that derive their deviation from the
tensors (a row sum, a norm, ``q.k``) rather than comparing two of them. This is how PyTorch's
SDPA tests set theirs (test_transformers.py: the allowance scales with a low-precision
reference's deviation from a float64 golden run, times a fudge factor).

The floor cannot see the golden twin's own rounding, so the allowance never goes below that
rounding's bound, ``FACTOR * u * n`` for a sum of ``n`` terms rounded at unit roundoff ``u``
(Higham 2002 §3.1, ``|error| <= n u |x||y|``):

- ``minimum = FACTOR * u64 * reduction``, with u64 = 2^-53 (float64's unit roundoff) and
  ``reduction`` the longest sum in a forward pass, ``max(d_model, d_mlp, n_ctx)``: the twin's float64
  rounding. It decides where the twin adds nothing: a float64 model (its twin is itself, so a
  float64 reorder is all there is).
- **Unseen precision.** Modeling code computes parts in float32 whatever the weights' dtype
  (transformers' eager attention: ``softmax(..., dtype=torch.float32).to(query.dtype)``), so the
  float64 twin's pattern is a float32 result, the model's is the same float32 result, and the floor
  reads 0 where the twin is not golden at all (a row of identical keys: weights 1/3 in both, summing
  to ``1 - 2^-25``). A tensor the twin hands back whose finite values are all float32 values (they
  survive a round trip through float32) was computed at float32, and the example's allowance is at
  least ``FACTOR * u32 * n`` for it, ``n`` the reduction that made it: the key count for an attention
  pattern (the softmax's normalising sum), ``max(d_model, d_mlp)`` for any other tensor (a linear
  layer's dot product). A float32 twin (the fallback of a bfloat16/float16 model) is such a twin
  everywhere. Measured from the tensor, not typed per model: where the twin computes in float64, its
  tensors carry float64 values and only the float64 minimum applies.

A float32/bfloat16/float16 model's own rounding is in its measured floor. The allowance is never 0
and never NaN: the floor is a maximum of finite gaps, and both bounds are positive.

A model no float64 twin can be made of (a plain function behind FunctionModel; a model accelerate
dispatched over devices, which is never copied: harness/adapters/dispatch.py, its rows' reason says so)
is judged by the property's declared float32 tolerance, and its row says so (noise_floor NaN); so is a float32 model
whose float64 copy cannot run (transformers' XGLM overflows building float64's minimum in float32),
while a bfloat16/float16 one then takes a float32 twin (rounding 2^-24 against 2^-8: still golden). On an example where
the twin goes non-finite and the model does not (the zoo's tiny Gemma-2 in float64 turns an
all-masked padded row into NaN, which reaches real rows through 0 * NaN), the floor is the
model's on a plain unpadded input, same hooks: its rounding noise at this dtype, measured once.

Hidden bugs. In bfloat16 or float16 a small bug can deviate less than the rounding does. A
calibrated row that passes on such a model is run again on its golden twin (the same code at
float64) on the inputs its search drew, worst ratio first (a replay, not a new search: no new
draws, no shrinking), judged by the property's declared float32 tolerance (modeling code computes parts in
float32 whatever the weights' dtype: rotary phases, softmax upcasts): if the twin fails it, the row stays a pass at the
model's dtype, since its verdict is about the numbers this model computes, and its reason
starts with :data:`HIDDEN`, naming the twin's worst deviation and counterexample. So the bug is
reported as hidden under rounding, not missed silently.

Non-finite values. Every check but ``finite_outputs`` (calibrated, exact, or one with its own
dtype-derived allowance) that reads a non-finite tensor (``-inf`` allowed in ``hook_attn_scores``,
where it is how masked scores are written) cannot compare anything: the row is **unobservable**
with reason :data:`NOT_COMPARABLE`, and ``finite_outputs`` (exact) names where they go non-finite.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

from harness.adapters import protocol
from harness.adapters.dispatch import is_dispatched
from harness.adapters.placement import placed
from harness.errors import AttnlabError
from properties import cost
from properties.design import model_dtype, unit_roundoff
from properties.twin_conv import reroute_depthwise

FACTOR = 4.0
NOT_COMPARABLE = "not comparable: non-finite values (see finite_outputs)"
HIDDEN = "hidden under rounding"
RULE = ("measured: 4 x the noise floor against a float64 twin, at least 4 u x reduction for the twin's own "
        "rounding (u64, or u32 where the twin computed a tensor in float32; docs/precision.md)")


def nonfinite_mask(name: str, t: Tensor) -> Tensor:
    """bool: the entries of hook (or output) ``name`` that are not finite; ``-inf`` is allowed in scores and in
    the additive masks and biases added to them (-inf is how a masked score is written: TransformerLens's bridge
    fires DeepSeek-V4's compressor block mask at ``compressor.hook_block_bias``, -inf off the selected blocks)."""
    if not t.is_floating_point():
        return torch.zeros_like(t, dtype=torch.bool)
    if name.endswith(("hook_attn_scores", "_bias", "_mask")):
        return t.isnan() | (t == math.inf)
    return ~torch.isfinite(t)


def masked_fill(t: Tensor) -> Tensor:
    """bool: the entries at or below half ``t``'s dtype's most negative finite value: an additive mask's fill.

    transformers writes a masked score as ``torch.finfo(dtype).min`` (added to the score, or in its place), so
    a bfloat16 model's masked entries sit at -3.39e38 where its float64 twin's sit at -1.8e308: the two
    differ by the fill, not by rounding, and a gap over them would measure the fill.
    """
    if not t.is_floating_point():
        return torch.zeros_like(t, dtype=torch.bool)
    return t <= torch.finfo(t.dtype).min / 2


def scaled_gap(own: Tensor, golden: Tensor, at_least: float = 0.0) -> float:
    """``max|own - golden| / max(at_least, max|golden|)`` over the entries finite and unmasked in both (0 for empty
    or all-zero tensors).

    Relative to the tensor's own scale, not ``max(1, .)``: a tensor of small entries (q, k, a
    pattern) carries the same relative rounding as a large one, and a check that compares norms
    or row sums of it measures in that relative unit. For checks scaled by ``max(1, .)`` this
    floor is only larger, so the bound below still holds. A masked entry (:func:`masked_fill`, on
    either side) is left out as ``-inf`` is: its value is a fill, and ``max|golden|`` over the fills
    would make the floor the fill's rounding, not the scores'.

    ``at_least`` 1 measures the gap in the unit the checks compare logits in (``max(1, max|logit|)``:
    properties/checks/_common.py ``scaled_deviation``): a model whose logits are all small (a random
    init's, ~0.1) rounds them by its relative precision, and that gap relative to ``max|logit|`` would
    be ten times the deviation rounding causes in the check's unit, an allowance ten times too wide.
    """
    golden = golden.to(own.device)
    if own.numel() == 0:
        return 0.0
    delta = golden.double() - own  # in float64, own cast inside the subtraction
    if own.is_floating_point() and golden.is_floating_point():
        # the common case in three reductions: every entry finite and unmasked on both sides (a NaN or an infinity
        # on either side makes the difference's min or max non-finite; a fill is at or below half the minimum)
        low, high = torch.aminmax(delta)
        g_low, g_high = torch.aminmax(golden)
        finite = math.isfinite(float(low)) and math.isfinite(float(high))
        if (finite and float(own.amin()) > torch.finfo(own.dtype).min / 2
                and float(g_low) > torch.finfo(golden.dtype).min / 2):
            top = max(at_least, -float(g_low), float(g_high))
            return max(-float(low), float(high)) / top if top > 0 else 0.0
    skip = masked_fill(own) | masked_fill(golden) | ~torch.isfinite(own) | ~torch.isfinite(golden)
    if bool(skip.all()):
        return 0.0
    # zeros in place of the skipped entries rather than a boolean gather (a Gemma-3 logits tensor is ~10M entries,
    # compared a few hundred times a check)
    diff = float(delta.abs_().masked_fill_(skip, 0.0).max())
    top = max(at_least, float(golden.abs().masked_fill_(skip, 0.0).max()))
    return diff / top if top > 0 else 0.0


def gap(name: str, own: Tensor, golden: Tensor) -> float:
    """The floor's gap for hook (or output) ``name``: the logits in the checks' ``max(1, .)`` unit, any other
    tensor relative to its own scale (:func:`scaled_gap`)."""
    return scaled_gap(own, golden, at_least=1.0 if name == "logits" else 0.0)


def coarse(model: Any) -> bool:
    """Whether ``model`` computes in a dtype coarser than float32 (bfloat16, float16): rounding wide enough
    that a small bug can pass under it, so a passing calibrated row also runs on the golden twin
    (properties/registry.py) and says when the twin fails it."""
    return unit_roundoff(model_dtype(model)) > unit_roundoff(torch.float32)


def reduction_size(cfg: Any) -> int:
    """The longest sum in a forward pass: a dot product over d_model, d_mlp, or the keys of n_ctx."""
    return max(int(cfg.d_model), int(getattr(cfg, "d_mlp", 0) or 0), int(cfg.n_ctx))


def computed_unit(t: Tensor) -> float:
    """The unit roundoff ``t`` was computed at: its dtype's, or float32's for a float64 tensor of float32 values.

    A float64 tensor whose finite entries all survive a round trip through float32 was computed in float32
    (or holds only values exact at any precision, where the bound this sets is harmless).
    """
    if t.dtype != torch.float64:
        return unit_roundoff(t.dtype) if t.is_floating_point() else 0.0
    if not bool(torch.isfinite(t).any()):
        return unit_roundoff(torch.float64)  # nothing finite to read
    # an infinity survives the round trip, a NaN never equals itself: only the finite entries decide
    exact = bool(((t.float().double() == t) | t.isnan()).all())
    return unit_roundoff(torch.float32 if exact else torch.float64)


def terms(name: str, t: Tensor, cfg: Any) -> int:
    """The length of the sum that produced hook (or output) ``name``: the keys of a pattern, else a layer's width."""
    if name.endswith("hook_pattern") and t.dim() >= 1:
        return max(1, int(t.shape[-1]))
    return max(int(cfg.d_model), int(getattr(cfg, "d_mlp", 0) or 0))


@dataclass
class Noise:
    """One check's calibration: the golden twin, and per example the floor and any non-finite read."""

    model: Any
    golden: Optional[Any]
    minimum: float
    measured: bool = True  # False: the check keeps its own allowance, only non-finite reads are watched
    local: bool = False  # the twin starts every layer from the model's own layer input (one layer's rounding)
    floor: float = 0.0
    unseen: float = 0.0  # the twin's own rounding where it computed in float32 (module doc: unseen precision)
    nonfinite: str = ""
    blind: bool = False  # the twin went non-finite where the model did not: no floor on this example
    seen: tuple[str, ...] = ()  # the hooks this example captured (for the reference floor)
    reference: dict[tuple[str, ...], float] = field(default_factory=dict)

    @property
    def calibrated(self) -> bool:
        """False when no float64 twin exists and the model is not float64 itself: use the declared tolerance."""
        return self.measured and (self.golden is not None or model_dtype(self.model) == torch.float64)

    def start(self) -> None:
        self.floor, self.unseen, self.nonfinite, self.blind, self.seen = 0.0, 0.0, "", False, ()

    def example_floor(self) -> float:
        """The example's floor; where the twin was blind, the model's floor on a plain input instead."""
        if not self.blind or self.golden is None:
            return self.floor
        if self.seen not in self.reference:
            x = torch.arange(min(self.model.cfg.n_ctx, 8))[None] % self.model.cfg.d_vocab
            own, own_acts = protocol.forward_capture(self.model, x, capture=self.seen)
            gold, gold_acts = protocol.forward_capture(self.golden, x, capture=self.seen)
            gaps = [gap("logits", own, gold)] + [gap(n, own_acts[n], gold_acts[n]) for n in self.seen]
            self.reference[self.seen] = max(gaps)
        return max(self.floor, self.reference[self.seen])

    def allowance(self) -> float:
        return max(FACTOR * self.example_floor(), self.minimum, self.unseen)

    def record(self, name: str, own: Tensor, golden: Optional[Tensor]) -> None:
        if not self.nonfinite and bool(nonfinite_mask(name, own).any()):
            self.nonfinite = name
        if name != "logits":
            self.seen = tuple(dict.fromkeys([*self.seen, name]))
        # the rounding no floor sees: the twin's own, or a float64 model's (its own twin)
        computed = golden if golden is not None else own if self.golden is None and own.dtype == torch.float64 \
            else None
        if computed is not None:
            self.unseen = max(self.unseen, FACTOR * computed_unit(computed) * terms(name, computed, self.model.cfg))
        if golden is None:
            return
        if bool((nonfinite_mask(name, golden.to(own.device)) & ~nonfinite_mask(name, own)).any()):
            self.blind = True  # e.g. a float64 mask minimum that a soft-cap turns into NaN
        self.floor = max(self.floor, gap(name, own, golden))


_ACTIVE: ContextVar[Optional[Noise]] = ContextVar("attnlab_precision_noise", default=None)
_TWINS: weakref.WeakKeyDictionary[Any, tuple[tuple[int, ...], Optional[Any]]] = weakref.WeakKeyDictionary()


def fingerprint(model: Any) -> tuple[int, ...]:
    """Changes when a parameter or buffer is replaced or written in place, so a stale twin is not reused.

    A plain attribute changed after a check (``module.scaling = ...``) is not seen: build the model anew.
    """
    return tuple(v for p in [*model.parameters(), *model.buffers()] for v in (p.data_ptr(), p._version))


def golden_twin(model: Any) -> Optional[Any]:
    """A float64 copy of ``model`` (cached while its weights are unchanged); None if it is float64 or cannot be made.

    Where the float64 copy raises on its first input, :func:`fallback_twin` replaces it (forward_capture
    does this): a float32 copy for a bfloat16/float16 model, none for a float32 one.

    A copy that still computes in a lower dtype (a function ignoring its parameters' dtype) is no twin.
    """
    if model_dtype(model) == torch.float64 or is_dispatched(model):  # a dispatched model is never copied (NO_TWIN)
        return None
    key = fingerprint(model)
    cached = _TWINS.get(model)
    if cached is not None and cached[0] == key:
        return cached[1]
    with cost.setup():  # made once per model: not a row's passes (properties/cost.py)
        return _make_twin(model, key)


def _make_twin(model: Any, key: tuple[int, ...]) -> Optional[Any]:
    if not _deterministic(model):
        # a model that differs from itself (dropout left on in eval, torchtune #1791) would put its own
        # randomness into the floor and hide behind it: no twin, the check's declared tolerance
        _TWINS[model] = (key, None)
        return None
    made = _twin_at(model, torch.float64)  # one float64 copy
    if made is None or not _sees_what_the_model_sees(model, made):
        # the float64 copy cannot even be built and adapted (its smoke pass raised), or it goes non-finite on a
        # plain input the model computes (ProphetNet's float64 copy gives NaN logits): as below
        return fallback_twin(model)
    _TWINS[model] = (key, made)
    return made


def _sees_what_the_model_sees(model: Any, twin: Any) -> bool:
    """Whether ``twin`` is finite wherever ``model`` is on a plain input: a twin blind there has no floor to give
    (its every gap would read 0 and the allowance fall to float64's minimum). The model runs once more here rather
    than reuse the determinism probe's output: each then runs once after the copy, so a model with state (a call
    counter) stays in step with its twin (tests/test_properties.py::test_a_non_deterministic_model_is_reported)."""
    x = torch.arange(min(model.cfg.n_ctx, 4))[None] % model.cfg.d_vocab
    try:
        own, gold = protocol.forward_capture(model, x)[0], protocol.forward_capture(twin, x)[0]
    except protocol.ModelError:
        return True  # it cannot run this input: the checks report that, not the twin
    return not bool((nonfinite_mask("logits", gold.to(own.device)) & ~nonfinite_mask("logits", own)).any())


def _deterministic(model: Any) -> bool:
    """Whether ``model`` gives the same logits, to the bit, twice on one plain input.

    The model itself, at its own dtype, before its twin is copied: a model that differs from itself
    (torchtune #1791: dropout left on in eval) does so at any dtype, and the twin, copied after,
    carries whatever state the two passes left (a model with state, such as a call counter, stays
    in step with its twin). Its two short passes replace two float64 copies of the weights (three
    float64 copies of GPT-2 small took ~11 s on 2 loaded cores).
    """
    x = torch.arange(min(model.cfg.n_ctx, 4))[None] % model.cfg.d_vocab
    try:
        outputs = [protocol.forward_capture(model, x)[0] for _ in range(2)]
    except protocol.ModelError:
        return True  # it cannot run this input: the checks report that, not the twin
    # NaN where both passes give NaN is the same output (a float16 model that overflows on the plain input, as
    # Gemma-3 does after <bos>, is deterministic: torch.equal would call it random and take its twin away)
    a, b = outputs
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def fallback_twin(model: Any) -> Optional[Any]:
    """The twin to use when the float64 one raised (transformers' XGLM builds a float32 tensor from
    float64's minimum and overflows): a float32 copy for a bfloat16/float16 model (rounding 2^-24
    against bf16's 2^-8: still golden), else None (the check's declared tolerance)."""
    made = _twin_at(model, torch.float32) if unit_roundoff(model_dtype(model)) > unit_roundoff(torch.float32) \
        else None
    _TWINS[model] = (fingerprint(model), made)
    return made


def _twin_at(model: Any, dtype: torch.dtype) -> Optional[Any]:
    try:
        twin = placed(model, dtype=str(dtype).removeprefix("torch.")).eval()  # a copy: the user's model is untouched
    except AttnlabError:  # e.g. a dtype this device cannot compute in
        return None
    if model_dtype(twin) != dtype:
        return None
    if dtype == torch.float64:
        reroute_depthwise(twin)  # the same numbers as torch's float64 depthwise kernel, 7-35x sooner
    return twin


def noise_for(model: Any, *, measured: bool = True, local: bool = False) -> Noise:
    """The calibration of one check on ``model``: its golden twin (when ``measured``) and the float64 minimum.

    ``local``: the floor of one layer's rounding (see :func:`forward_capture`).
    """
    minimum = FACTOR * unit_roundoff(torch.float64) * reduction_size(model.cfg)
    return Noise(model, golden_twin(model) if measured else None, minimum, measured, local)


def layer_inputs(model: Any) -> list[str]:
    """The hooks a local floor patches: every layer's input (``blocks.{l}.hook_resid_pre``)."""
    return [f"blocks.{layer}.hook_resid_pre" for layer in range(model.cfg.n_layers)]


@contextmanager
def calibrating(noise: Optional[Noise]) -> Iterator[None]:
    """Within the block, :func:`forward_capture` on ``noise.model`` records into ``noise``."""
    token = _ACTIVE.set(noise)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def forward_capture(model: Any, tokens: Tensor, **kw: Any) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`harness.adapters.protocol.forward_capture`, also run on the golden twin when a check is calibrating.

    Records the scaled deviation of the logits and every captured activation from the twin's (a
    patched pass is not twinned: its patch values are the model's own-dtype activations).

    A local floor (``Noise.local``, for a check comparing tensors of one pass with each other) also
    captures the model's input to every layer and hands it, upcast, to the twin in place of the
    twin's own: each layer of the twin then computes exactly, from the same input, what that layer
    of the model rounds, and the gap is that one layer's rounding, not the divergence of everything
    before it (which such a comparison never sees). A model whose layer inputs cannot be captured
    and replaced gets the whole-pass floor.

    ``compared`` (bool ``[batch, pos]``, not passed on) names the positions whose logits the check
    compares: the logits' floor is measured there only. A padded query's logits, which no check reads,
    round worse than a real token's (SmolLM2 in bfloat16: 0.12 of the logits' scale against 0.02), and
    the triangle bound of the module doc needs the floor only at the entries the check compares.
    """
    logits, acts = _calibrated(model, tokens, kw, stop=False)
    assert logits is not None  # a pass that is not stopped returns its logits
    return logits, acts


def capture_activations(model: Any, tokens: Tensor, **kw: Any) -> dict[str, Tensor]:
    """:func:`harness.adapters.protocol.capture_activations` (no logits, the pass ends at the last captured hook),
    twinned as :func:`forward_capture` is: the floor is that of the activations the check reads."""
    return _calibrated(model, tokens, kw, stop=True)[1]


def twinned(model: Any, run: Callable[[Any], Tensor], name: str = "logits") -> Tensor:
    """``run(model)``, also run on the golden twin when a check is calibrating on ``model``: the deviation of what
    it returns from the twin's goes into the example's floor, as :func:`forward_capture`'s does.

    For a pass the adapters' forward does not make, such as cached decoding: a check comparing it with a full
    forward needs the rounding of both sides (the triangle bound of the module doc); measured on the full forward
    alone, a floor drawn from two tokens can be small by chance while the cached path rounds otherwise (a small
    Gemma in float32: cached 1.8e-7 from the full forward, a full-forward floor of 4.3e-8)."""
    own = run(model)
    noise = _ACTIVE.get()
    if noise is None or model is not noise.model or noise.golden is None:
        return own
    try:
        golden = run(noise.golden)
    except protocol.ModelError:  # the twin cannot run this call: the floor stays what the other passes measured
        return own
    noise.record(name, own, golden)
    return own


def _run(model: Any, tokens: Tensor, kw: dict[str, Any], stop: bool) -> tuple[Optional[Tensor], dict[str, Tensor]]:
    if stop:
        return None, protocol.capture_activations(model, tokens, **kw)
    return protocol.forward_capture(model, tokens, **kw)


def _calibrated(model: Any, tokens: Tensor, kw: dict[str, Any],
                stop: bool) -> tuple[Optional[Tensor], dict[str, Tensor]]:
    compared: Optional[Tensor] = kw.pop("compared", None)
    noise = _ACTIVE.get()
    if noise is None or model is not noise.model:
        return _run(model, tokens, kw, stop)
    twin = noise.golden if not kw.get("patch") else None
    inputs = layer_inputs(model) if twin is not None and noise.local else []
    wanted = list(kw.get("capture", ()))
    try:
        logits, acts = _run(model, tokens, {**kw, "capture": [*wanted, *inputs]}, stop)
    except protocol.HookNotObserved:
        if not inputs:
            raise
        noise.local, inputs = False, []  # no layer inputs to hand over: the whole-pass floor
        logits, acts = _run(model, tokens, kw, stop)
    given = {name: acts[name] for name in inputs}
    acts = {name: t for name, t in acts.items() if name in wanted}
    g_logits: Optional[Tensor] = None
    g_acts: dict[str, Tensor] = {}
    if twin is not None:
        g_logits, g_acts = _twin_pass(noise, model, twin, tokens, kw, given, stop)
    for name, own in acts.items():
        noise.record(name, own, g_acts.get(name))
    if logits is None:
        return logits, acts
    if compared is None or g_logits is None:
        noise.record("logits", logits, g_logits)
    else:
        where = compared.to(logits.device).bool()
        noise.record("logits", logits[where], g_logits.to(logits.device)[where])
    return logits, acts


def _twin_pass(noise: Noise, model: Any, twin: Any, tokens: Tensor, kw: dict[str, Any],
               given: dict[str, Tensor], stop: bool) -> tuple[Optional[Tensor], dict[str, Tensor]]:
    """The twin's logits (None for a stopped pass) and activations for the same call, started from ``given``
    layer inputs if any."""
    try:
        call: dict[str, Any] = dict(kw)
        if given:
            call["patch"] = {name: t.to(model_dtype(twin)) for name, t in given.items()}
        return _run(twin, tokens, call, stop)
    except protocol.HookNotObserved:  # the twin's layer inputs cannot be replaced: the whole-pass floor
        noise.local = False
        return _run(twin, tokens, kw, stop)
    except protocol.ModelError:  # the model's own code cannot run at the twin's dtype
        noise.golden = twin = fallback_twin(model)
        if twin is None:
            return None, {}
        return _twin_pass(noise, model, twin, tokens, kw, given, stop)
