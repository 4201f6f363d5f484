"""The model protocol (docs/architecture.md) as a check, and the helpers that talk to a model through it.

Everything in :mod:`properties` reaches a model only through what this module checks:
``cfg`` fields, ``forward(tokens, attention_mask=None, position_offset=0)`` and named hook
points. A model that lacks a piece gets one TypeError that lists every missing piece.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Optional, Protocol, Union, cast

import torch
from jaxtyping import Float, Float64, Int, Shaped
from torch import Tensor
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from harness._checks import is_int
from harness.adapters.dispatch import input_device
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.protocol_facts import (
    ADDED_POSITIONS,
    ATTENTION_DIRS,
    CFG_FIELDS,
    IS_ENCODER_DECODER,
    POSITIONAL_TYPES,
)

# The attention hook points every layer must expose; the property checks read q/k/scores/pattern,
# and probes gate heads through hook_z.
ATTN_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")
ROTARY_HOOKS = ("hook_rot_q", "hook_rot_k")
BLOCK_HOOKS = ("hook_resid_pre", "hook_resid_post")

# (hook name or name filter, hook function), as HookedRootModule.hooks takes them
FwdHooks = list[tuple[Union[str, Callable[..., Any]], Callable[..., Any]]]


class ModelCfg(Protocol):
    """What the protocol reads of ``model.cfg`` (read-only: a frozen config satisfies it)."""

    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def d_head(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def d_vocab(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def positional_embedding_type(self) -> str: ...  # one of POSITIONAL_TYPES
    @property
    def attention_dir(self) -> str: ...  # one of ATTENTION_DIRS


class ProtocolModel(Protocol):
    """The model protocol as a type: what :func:`check_protocol` verifies at run time.

    The static half of the protocol (mypy); a model passes :func:`check_protocol` only if it
    also is a ``HookedRootModule`` with the hook points the checks read. Functions typed with
    it take a model that has already been checked (or wrapped by an adapter).
    """

    @property
    def cfg(self) -> ModelCfg: ...

    hook_dict: dict[str, HookPoint]

    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor] = ...,
                 position_offset: int = ..., **kwargs: Any) -> Any: ...  # kwargs: e.g. TL's stop_at_layer

    def forward(self, tokens: Tensor, attention_mask: Optional[Tensor] = ...,
                position_offset: int = ...) -> Any: ...

    def hooks(self, fwd_hooks: FwdHooks = ..., bwd_hooks: FwdHooks = ..., reset_hooks_end: bool = ...,
              clear_contexts: bool = ...) -> AbstractContextManager[Any]: ...

    def run_with_hooks(self, *model_args: Any, fwd_hooks: FwdHooks = ..., bwd_hooks: FwdHooks = ...,
                       reset_hooks_end: bool = ..., clear_contexts: bool = ..., **model_kwargs: Any) -> Any: ...

    def parameters(self, recurse: bool = ...) -> Iterator[torch.nn.Parameter]: ...

    def modules(self) -> Iterator[torch.nn.Module]: ...

    def eval(self) -> Any: ...

    def train(self, mode: bool = ...) -> Any: ...

    @property
    def training(self) -> bool: ...


# What an entry point (check_protocol, properties.check_model, the public probes) accepts: a
# protocol model or a model an adapter wraps (Hugging Face, TransformerLens bridge), both
# nn.Modules; the entry point checks it and raises one TypeError listing every missing piece.
AnyModel = Union[ProtocolModel, torch.nn.Module]


def required_hooks(cfg: ModelCfg) -> list[str]:
    """The hook point names :func:`check_protocol` requires of a model with this ``cfg``."""
    names = []
    for layer in range(cfg.n_layers):
        names += [f"blocks.{layer}.{h}" for h in BLOCK_HOOKS]
        attn = list(ATTN_HOOKS) + (list(ROTARY_HOOKS) if cfg.positional_embedding_type == "rotary" else [])
        names += [f"blocks.{layer}.attn.{h}" for h in attn]
    if cfg.positional_embedding_type in ADDED_POSITIONS:
        names.append("hook_pos_embed")
    return names


def _cfg_problems(model: Any) -> list[str]:
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        return ["no attribute cfg"]
    problems = []
    for name in CFG_FIELDS:
        if not hasattr(cfg, name):
            problems.append(f"no cfg.{name}")
    if problems:
        return problems
    for name in ("n_layers", "n_heads", "d_head", "d_model", "d_vocab", "n_ctx"):
        value = getattr(cfg, name)
        if not is_int(value) or value < 1:
            problems.append(f"cfg.{name}={value!r} is not an integer >= 1")
    if cfg.positional_embedding_type not in POSITIONAL_TYPES:
        problems.append(f"cfg.positional_embedding_type={cfg.positional_embedding_type!r} is not one of "
                        f"{list(POSITIONAL_TYPES)}")
    if cfg.attention_dir not in ATTENTION_DIRS:
        problems.append(f"cfg.attention_dir={cfg.attention_dir!r} is not one of {list(ATTENTION_DIRS)}")
    return problems


def _forward_problems(model: HookedRootModule) -> list[str]:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return ["forward has no inspectable signature"]
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return [f"forward has no {name!r} argument" for name in ("attention_mask", "position_offset")
            if name not in params and not has_var_kw]


def check_protocol(model: AnyModel, *, hooks: bool = True, forward: bool = True) -> None:
    """Raise TypeError listing every piece of the model protocol that ``model`` lacks.

    Always checks the class (a ``transformer_lens.HookedRootModule`` with ``setup()`` called), the
    ``cfg`` fields and their values, the ``forward`` arguments, and that a two-token forward pass
    returns logits ``[batch, pos, d_vocab]`` (:func:`smoke_forward`: a model that raises in it gets
    one AttnlabError naming the exception). With ``hooks=True`` the hook points in
    :func:`required_hooks` must also exist *and fire* in that smoke forward (counting hooks are
    attached to them): a name in ``hook_dict`` that never fires is reported as such. The property
    suite calls ``hooks=False``: there a missing or silent hook makes only the properties that need
    it unobservable (see :func:`observed_hooks`), it does not reject the model.

    ``forward=False`` skips the ``forward`` arguments and the smoke pass (hooks are then only looked
    up, not fired): the probes call it so, since they refuse bad input before any forward pass and
    adapt to a forward without ``attention_mask`` or ``position_offset``.
    """
    if not isinstance(model, HookedRootModule):
        hint = " (wrap a TransformerBridge with properties.BridgeAdapter)" if hasattr(model, "original_model") else \
            " (a plain module or function: properties.check_model(model, cfg=...) checks its outputs)" \
            if callable(model) else ""
        raise AttnlabTypeError(f"model of type {type(model).__name__} does not follow the model protocol: "
                               f"it is not a transformer_lens.HookedRootModule{hint}")
    missing = _cfg_problems(model)
    hook_dict = getattr(model, "hook_dict", None)
    if hook_dict is None:
        missing.append("no hook_dict (call setup() at the end of __init__)")
    if forward:
        missing += _forward_problems(model)
    watch: list[str] = []
    checked = cast(ProtocolModel, model)  # used only once cfg, hook_dict and forward passed the checks above
    if not missing and hooks:
        watch = [name for name in required_hooks(checked.cfg) if name in checked.hook_dict]
        missing += [f"no hook point {name}" for name in required_hooks(checked.cfg) if name not in checked.hook_dict]
    if not missing and forward:
        problems, fired = smoke_forward(checked, watch)
        missing += problems
        if not problems:
            missing += [f"hook point {name} never fires in a forward pass" for name in watch if name not in fired]
    if missing:
        raise AttnlabTypeError(f"model of type {type(model).__name__} does not follow the model protocol: "
                               + "; ".join(missing))


def observed_hooks(model: ProtocolModel) -> set[str]:
    """The names in ``model.hook_dict`` whose hook fires in a plain two-token forward pass.

    The property suite computes this once per :func:`properties.check_model` run; a property
    that needs a hook outside this set is unobservable on the model (not failed). ``model``
    must already pass ``check_protocol(model, hooks=False)``.
    """
    problems, fired = smoke_forward(model, list(model.hook_dict))
    if problems:
        raise AttnlabTypeError(f"model of type {type(model).__name__} does not follow the model protocol: "
                               + "; ".join(problems))
    return fired


def smoke_forward(model: ProtocolModel, watch: Iterable[str] = (), *, label: Optional[str] = None
                  ) -> tuple[list[str], set[str]]:
    """The plain two-token forward pass every entry runs before any work: its problems, and which of ``watch`` fired.

    All tokens real, ``position_offset=0``. A ``TypeError`` (the forward does not take the
    protocol's arguments) and logits that are not ``[batch, pos, d_vocab]`` are protocol problems,
    returned; any other exception is the model's own failure, raised as one :class:`AttnlabError`
    naming it (``label`` names the model, default its class).
    """
    cfg = model.cfg
    n = min(2, cfg.n_ctx)
    tokens = torch.zeros(1, n, dtype=torch.long, device=model_device(model))
    fired: set[str] = set()

    def count(name: str):
        def hook(tensor: Any, hook: Any) -> None:
            fired.add(name)
        return hook

    try:
        with torch.no_grad(), model.hooks(fwd_hooks=[(name, count(name)) for name in watch]):
            logits = model(tokens, attention_mask=torch.ones_like(tokens), position_offset=0)
    except TypeError as exc:
        return [f"forward(tokens, attention_mask=..., position_offset=0) raised TypeError: {exc}"], fired
    except Exception as exc:  # any failure of the model itself is one error, before any work
        raise AttnlabError(f"{label or f'the model ({type(model).__name__})'} raised {type(exc).__name__} on a "
                           f"plain {n}-token input: {exc}") from exc
    if not isinstance(logits, Tensor) or tuple(logits.shape) != (1, n, cfg.d_vocab):
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        return [f"forward returned {got}, expected logits [batch, pos, d_vocab] = {(1, n, cfg.d_vocab)}"], fired
    return [], fired


def model_device(model: AnyModel) -> torch.device:
    """Where ``model`` takes its inputs: accelerate's run device for a dispatched model (its first
    parameter may be an offloaded ``meta`` placeholder: harness/adapters/dispatch.py), else its first parameter's."""
    dispatched = input_device(model)
    if dispatched is not None:
        return dispatched
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


class HookNotObserved(Exception):
    """A hook a check needs did not fire, the harness's own hook code failed on it, or the adapter
    cannot run the input (:class:`UnsupportedInput`).

    The property suite turns it into an *unobservable* result, never a failed one: it says the
    harness could not look, not that the model is wrong. ``reason`` names the hook.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class UnsupportedInput(ValueError):
    """Raised by an adapter for a valid protocol input it cannot pass to the model it wraps.

    E.g. a ``position_offset`` for an architecture whose forward takes no position ids. The
    property suite reports the property as unobservable (the harness could not look), not as a
    failure of the model. A model's own code raises ordinary exceptions, which do fail.
    """


class ModelError(Exception):
    """The model itself raised on a protocol input (``original`` is its exception)."""

    def __init__(self, original: BaseException):
        super().__init__(f"{type(original).__name__}: {original}")
        self.original = original


def call_model(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with any exception it raises wrapped in :class:`ModelError`."""
    try:
        return fn(*args, **kwargs)
    except (HookNotObserved, ModelError, _Captured):
        raise
    except UnsupportedInput as exc:
        raise HookNotObserved(f"the adapter cannot run this input: {exc}") from exc
    except Exception as exc:
        raise ModelError(exc) from exc


class _Saver:
    """Stores its hook point's activation; with ``wanted`` (the names of a stopping capture), ends the pass
    (:class:`_Captured`) once every wanted name is stored."""

    def __init__(self, store: dict, errors: dict, name: str, wanted: Optional[set[str]] = None):
        self.store, self.errors, self.name, self.wanted = store, errors, name, wanted

    def __call__(self, tensor: Tensor, hook: Any) -> None:
        try:  # the harness's own hook must never break (or fail) the model's forward pass
            # clone: an implementation may reuse or modify the buffer after the hook returns
            self.store[self.name] = tensor.detach().clone()
        except Exception as exc:
            self.errors[self.name] = f"{type(exc).__name__}: {exc}"
            return
        if self.wanted is not None and self.wanted <= self.store.keys():
            raise _Captured


class _Patcher:
    """Replaces a hook point's activation by a given tensor (same shape), e.g. to feed two runs one input."""

    def __init__(self, value: Tensor, errors: dict, applied: set, name: str):
        self.value, self.errors, self.applied, self.name = value, errors, applied, name

    def __call__(self, tensor: Tensor, hook: Any) -> Optional[Tensor]:
        self.applied.add(self.name)
        if not isinstance(tensor, Tensor) or tuple(tensor.shape) != tuple(self.value.shape):
            got = tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
            self.errors[self.name] = f"patch of shape {tuple(self.value.shape)} does not fit {got}"
            return None
        return self.value.to(tensor.device, tensor.dtype)


class _Captured(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the last capture hook of :func:`capture_activations` once every captured activation is stored.

    An Exception, not a BaseException: torch runs a module's ``always_call`` forward hooks (the pass counting of
    properties/cost.py) only for an Exception leaving the forward."""


@torch.no_grad()
def forward_capture(model: ProtocolModel, tokens: Int[Tensor, "batch pos"], *,
        attention_mask: Optional[Shaped[Tensor, "batch pos"]] = None, position_offset: int = 0,
        capture: Iterable[str] = (), patch: Optional[dict[str, Tensor]] = None,
        inputs: Optional[dict[str, Tensor]] = None) -> tuple[Float64[Tensor, "batch pos d_vocab"], dict[str, Tensor]]:
    """Logits (float64) and the activations at the ``capture`` hook points (as the model produced them).

    ``patch`` replaces the activation at each named hook point by the given tensor. Hooks are
    attached with ``model.hooks`` so they are removed even if the forward pass raises. A forward
    pass that raises raises :class:`ModelError`; a captured or patched hook that is not a hook
    point, does not fire, or that the harness's hook code fails on raises :class:`HookNotObserved`.
    ``inputs``: further keyword inputs of the forward (an encoder-decoder's ``source_tokens``, ``source_mask``).
    """
    logits, store = _hooked_forward(model, tokens, attention_mask, position_offset, list(capture), dict(patch or {}),
                                    inputs, stop=False)
    assert logits is not None  # a pass that is not stopped returns its logits
    return logits.detach().to("cpu", torch.float64), store


@torch.no_grad()
def capture_activations(model: ProtocolModel, tokens: Int[Tensor, "batch pos"], *, capture: Iterable[str],
        attention_mask: Optional[Shaped[Tensor, "batch pos"]] = None, position_offset: int = 0,
        patch: Optional[dict[str, Tensor]] = None, inputs: Optional[dict[str, Tensor]] = None) -> dict[str, Tensor]:
    """The activations :func:`forward_capture` captures, from a pass that ends once the last of them is stored.

    The layers after the last captured hook point and the unembedding do not run, and no logits are made: for a
    check that reads only activations, the unembedding is most of a pass's time and memory on a large vocabulary
    (Gemma-3's 262k: a 515-token pass makes 135M logits, 1.1 GB in float64). A patch whose hook point comes after
    the stop never fires and is not reported; it could not have changed what was captured.
    """
    capture = list(capture)
    if not capture:
        raise AttnlabError("capture_activations needs at least one hook point to capture: expected capture=[names]")
    return _hooked_forward(model, tokens, attention_mask, position_offset, capture, dict(patch or {}), inputs,
                           stop=True)[1]


def _hooked_forward(model: ProtocolModel, tokens: Tensor, attention_mask: Optional[Tensor], position_offset: int,
                    capture: list[str], patch: dict[str, Tensor], inputs: Optional[dict[str, Tensor]],
                    stop: bool) -> tuple[Optional[Tensor], dict[str, Tensor]]:
    store: dict[str, Tensor] = {}
    errors: dict[str, str] = {}
    absent = [name for name in [*capture, *patch] if name not in model.hook_dict]
    if absent:
        raise HookNotObserved(f"no hook point {absent[0]}")
    device = model_device(model)
    tokens = tokens.to(device)
    mask = attention_mask.to(device) if attention_mask is not None else None
    extra = {name: value.to(device) for name, value in (inputs or {}).items()}
    applied: set[str] = set()
    hooks: FwdHooks = [(name, _Patcher(value, errors, applied, name)) for name, value in patch.items()]
    wanted = set(capture) if stop else None
    hooks += [(name, _Saver(store, errors, name, wanted)) for name in capture]
    logits: Optional[Tensor] = None
    stopped = False
    try:
        with model.hooks(fwd_hooks=hooks):
            logits = call_model(model, tokens, attention_mask=mask, position_offset=position_offset, **extra)
    except _Captured:
        stopped = True
    if errors:
        name, msg = next(iter(errors.items()))
        raise HookNotObserved(f"the harness's hook on {name} failed: {msg}")
    silent = [name for name in capture if name not in store]
    silent += [] if stopped else [name for name in patch if name not in applied]
    if silent:
        raise HookNotObserved(f"hook {silent[0]} did not fire")
    return logits, {k: v.to("cpu") for k, v in store.items()}


def all_heads(x: Float[Tensor, "batch pos h d_head"], n_heads: int) -> Float[Tensor, "batch pos n_heads d_head"]:
    """``[batch, pos, h, d_head]`` -> ``[batch, pos, n_heads, d_head]``, repeating grouped-query K/V heads.

    Grouped-query attention (Ainslie et al. 2023) lets query head h use K/V head
    h // (n_heads / n_kv); a model may expose the n_kv heads unrepeated (HF Llama does).
    """
    h = x.shape[2]
    if h == n_heads:
        return x
    if n_heads % h:
        raise AttnlabTypeError(f"hook tensor has {h} heads, which does not divide cfg.n_heads={n_heads}")
    return x.repeat_interleave(n_heads // h, dim=2)


# --- optional: decoding through the model's own KV cache -------------------------------------------
CACHED_DECODING = "forward_with_cache"


class CachedDecoding(Protocol):
    """The optional cached-decoding method the ``kv_cache`` property decodes through (duck-typed).

    ``forward_with_cache(tokens, attention_mask=None, past=None) -> (logits, past)``:

    - ``tokens [batch, new]``: the next tokens of every row (``new >= 1``; a prompt, or one or more
      decoded tokens);
    - ``attention_mask [batch, new]``: 1 for a real token, 0 for padding, covering the *new* tokens
      only (None = all real); the model remembers the mask of everything in ``past``. Prompts are
      left-padded; later steps are all real;
    - ``past``: None to start a sequence, else exactly what the previous call returned (opaque to
      the caller: the model's own cache, e.g. a Hugging Face ``DynamicCache`` plus the mask so far;
      it may be updated in place, and a caller never reuses an older one);
    - returns the logits ``[batch, new, d_vocab]`` of the new tokens and the cache to pass next.

    Positions follow the protocol's rule at ``position_offset=0``: a token's position is the number
    of real tokens before it, counted over ``past`` and the new tokens. The result must equal one
    ``forward`` over the whole sequence so far with the concatenated mask. ``harness.Transformer``
    implements it with its ``kv_cache``; an HF adapter implements it with ``past_key_values``.
    """

    def forward_with_cache(self, tokens: Tensor, attention_mask: Optional[Tensor] = None,
                           past: Any = None) -> tuple[Tensor, Any]: ...


def has_cached_decoding(model: Any) -> bool:
    """Whether ``model`` exposes :class:`CachedDecoding`'s method."""
    return callable(getattr(model, CACHED_DECODING, None))


# --- optional: the encoder-decoder part (docs/architecture.md, "Encoder-decoders") ----------------------
def is_encoder_decoder(model: Any) -> bool:
    """Whether ``model`` declares itself an encoder-decoder (``cfg.is_encoder_decoder is True``): its forward
    then takes ``source_tokens`` and ``source_mask`` by keyword, and ``tokens`` is the decoder's input."""
    return getattr(model.cfg, IS_ENCODER_DECODER, False) is True
