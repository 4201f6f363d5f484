"""Input checks shared by every probe: raised before any forward pass, naming the value and what was expected.

Also prepares the data every probe works on (:class:`ProbeData`) and reads what a probe
needs to know about a model (:class:`ModelInfo`) through the model protocol only.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Optional, ParamSpec, TypeVar, cast

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from harness._checks import (
    check_bool,  # noqa: F401 - the probe modules import every check from here
    check_choice,
    check_ints,
    check_number,
    check_positive_int,
    check_sequence,
    is_number,
)
from harness.adapters.bridge import BridgeAdapter, is_bridge
from harness.adapters.entry import describe
from harness.adapters.placement import placed, placement_of
from harness.adapters.protocol import AnyModel, ProtocolModel, check_protocol, is_encoder_decoder
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.inputs import check_mask, check_source, check_tokens
from harness.model.protocol_facts import SOURCE_INPUTS, cross_attn_hook, encoder_hook

METHODS = ("ablation", "mean_ablation", "gradient", "attribution", "l0_gates")
ORDERS = ("importance", "random")
METRICS = ("pattern", "output")
# The keywords every public probe takes for where the model runs (harness.adapters.placed).
PLACEMENT = ("dtype", "device", "attn_implementation")
# The kinds of heads of an encoder-decoder (Vaswani et al. 2017, Fig. 1), in the order of a head mask's rows; what a
# label's prefix is for each (``enc L0H1``, ``L0H1``, ``xL0H1``) and what a report calls each stack.
KINDS = ("encoder", "decoder", "cross")
KIND_PREFIXES = {"encoder": "enc ", "decoder": "", "cross": "x"}
KIND_NAMES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}
_LABEL = re.compile(r"(enc |x)?L(\d+)(?:H(\d+))?")


def z_hook(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_z"


def pattern_hook(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"


def head_name(kind: Optional[str], layer: int, head: Optional[int] = None) -> str:
    """``L{layer}`` (``H{head}`` appended when given) of a decoder-only model's layer, prefixed by the kind of an
    encoder-decoder's: ``enc L0H1`` (encoder self-attention), ``L0H1`` (decoder self-attention), ``xL0H1``
    (cross-attention). The one spelling of a head's name: the probes' labels and keys and the report's rows."""
    prefix = "" if kind is None or kind != kind else KIND_PREFIXES[kind]  # kind != kind: a NaN read from a CSV
    return f"{prefix}L{int(layer)}" + ("" if head is None else f"H{int(head)}")


def parse_head_name(label: str) -> tuple[Optional[str], int, Optional[int]]:
    """``(kind, layer, head)`` of a :func:`head_name` (kind None for a plain ``L0H1``: a decoder-only model's head, or
    an encoder-decoder's decoder head, as the labels around it say); an error naming any other text."""
    match = _LABEL.fullmatch(str(label))
    if match is None:
        raise AttnlabError(f"head label {label!r} is invalid: expected L{{layer}}H{{head}}, optionally prefixed "
                           f"'enc ' (encoder) or 'x' (cross-attention)")
    prefix, layer, head = match.groups()
    kind = {"enc ": "encoder", "x": "cross"}.get(prefix or "")
    return kind, int(layer), None if head is None else int(head)


P = ParamSpec("P")
R = TypeVar("R")


def takes_any_model(probe: Callable[P, R]) -> Callable[P, R]:
    """A public probe's entry: a ``PreTrainedModel`` or ``TransformerBridge`` first argument goes behind
    its adapter (:func:`harness.adapters.entry.adapt`), and a DataFrame or Series result records it in
    ``attrs["adapter"]`` ("HFAdapter(gpt2, attention_interface)", "BridgeAdapter", "protocol model").

    Every public probe so takes the keywords :data:`PLACEMENT` (``dtype``, ``device``,
    ``attn_implementation``): the probe runs on a copy of the model placed there
    (:func:`harness.adapters.placed`; the caller's model is never cast), and ``attrs`` records what
    ran. Anything else reaches the probe unchanged, so :func:`model_info` still names what it lacks.
    """
    @functools.wraps(probe)
    def entry(*args: P.args, **kwargs: P.kwargs) -> R:
        where: dict[str, Any] = {name: kwargs.pop(name) for name in PLACEMENT if name in kwargs}
        if args:
            model = placed(args[0], **where)
            args = (model, *args[1:])  # type: ignore[assignment]
        elif "model" in kwargs:
            model = kwargs["model"] = placed(kwargs["model"], **where)
        else:
            return probe(*args, **kwargs)
        out = probe(*args, **kwargs)
        if isinstance(out, (pd.DataFrame, pd.Series)):
            out.attrs["adapter"] = describe(model)
            out.attrs.update(placement_of(model))  # dtype, device, attn_implementation
        return out

    # help() and inspect show the placement keywords the entry takes (the probe itself never sees them)
    sig = inspect.signature(probe)
    params = list(sig.parameters.values())
    tail = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in PLACEMENT]
    entry.__signature__ = sig.replace(parameters=[p for p in params if p not in tail] + extra + tail)  # type: ignore[attr-defined]
    return entry


@dataclass(frozen=True)
class ModelInfo:
    """What the probes read from a protocol model.

    ``n_layers`` is the number of rows of a head mask ``[n_layers, n_heads]``: a model's layers, or, for an
    encoder-decoder probed over all its heads (``model_info(all_heads=True)``), one row per attention layer of
    each kind: the encoder's self-attention layers, then the decoder's, then its cross-attention layers
    (:data:`KINDS`). Per row: ``z_hooks`` gates it, ``kinds``/``layers`` name it (``kinds`` is empty for a
    decoder-only view), ``starts`` is the first decoder layer whose output a change of that row moves (prefix
    reuse starts there) and ``reruns`` says whether the row runs again on every pass whatever layer the pass
    starts at (the encoder: the forward encodes the source on every call).
    """

    n_layers: int
    n_heads: int
    d_vocab: int
    causal: bool
    device: torch.device
    takes_attention_mask: bool
    prefix_reuse: bool  # forward(..., stop_at_layer=, start_at_layer=) skips the layers before the start
    hook_points: dict = field(default_factory=dict, compare=False, repr=False)  # name -> HookPoint
    d_model: int = 0  # sizes a backward pass's activations (probes.gates.grad_rows); 0: unknown
    z_hooks: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    layers: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()
    reruns: tuple[bool, ...] = ()
    pattern_hooks: tuple[str, ...] = ()  # per row, the hook_pattern of its heads

    @property
    def encoder_decoder(self) -> bool:
        """Whether the mask rows cover an encoder-decoder's three kinds of heads (its forward takes a source)."""
        return bool(self.kinds)

    @property
    def depth(self) -> int:
        """The layers ``forward(start_at_layer=)`` counts: the model's, or the decoder's of an encoder-decoder."""
        return max(self.starts) + 1 if self.starts else self.n_layers

    def kind(self, row: int) -> Optional[str]:
        """The kind of heads mask row ``row`` holds (:data:`KINDS`); None on a decoder-only view."""
        return self.kinds[row] if self.kinds else None

    def row_name(self, row: int) -> str:
        """``L{layer}`` of a mask row; an encoder-decoder's ``enc L0`` (encoder), ``L0`` (decoder), ``xL0`` (cross)."""
        return head_name(self.kind(row), self.layers[row] if self.kinds else row)

    def head_labels(self) -> list[str]:
        """``L{layer}H{head}`` per head in flat order; an encoder-decoder's ``enc L0H1``, ``L1H2``, ``xL1H2``."""
        return [f"{self.row_name(row)}H{h}" for row in range(self.n_layers) for h in range(self.n_heads)]

    def rows_of(self, kind: Optional[str]) -> list[int]:
        """The mask rows of one kind of heads, by layer (every row for None on a decoder-only view)."""
        return [r for r in range(self.n_layers) if self.kind(r) == kind]

    def fires_last(self, rows: list[int]) -> int:
        """Which of ``rows`` a forward pass reaches last: the encoder runs first, then each decoder layer's
        self-attention and its cross-attention (Vaswani et al. 2017, Fig. 1)."""
        rank = {"encoder": 0, None: 1, "decoder": 1, "cross": 1}
        return max(rows, key=lambda r: (rank[self.kind(r)], self.layers[r] if self.kinds else r,
                                        self.kind(r) == "cross"))


def _rows(cfg: Any, all_heads: bool, encoder_decoder: bool) -> dict[str, tuple]:
    """The head-mask rows of ``model_info``: one per layer, or per attention layer of each kind."""
    L = cfg.n_layers
    if not (all_heads and encoder_decoder):
        return dict(z_hooks=tuple(z_hook(layer) for layer in range(L)), kinds=(), layers=tuple(range(L)),
                    starts=tuple(range(L)), reruns=(False,) * L,
                    pattern_hooks=tuple(pattern_hook(layer) for layer in range(L)))
    E = cfg.n_encoder_layers
    names = [encoder_hook(layer, "attn.hook_z") for layer in range(E)] + [z_hook(layer) for layer in range(L)] + \
        [cross_attn_hook(layer, "hook_z") for layer in range(L)]
    patterns = [encoder_hook(layer, "attn.hook_pattern") for layer in range(E)] + \
        [pattern_hook(layer) for layer in range(L)] + [cross_attn_hook(layer, "hook_pattern") for layer in range(L)]
    return dict(z_hooks=tuple(names), kinds=("encoder",) * E + ("decoder",) * L + ("cross",) * L,
                layers=(*range(E), *range(L), *range(L)), starts=(0,) * E + (*range(L), *range(L)),
                reruns=(True,) * E + (False,) * (2 * L), pattern_hooks=tuple(patterns))


def model_info(model: AnyModel, *, need_pattern: bool = False, all_heads: bool = False) -> ModelInfo:
    """Check ``model`` follows the model protocol far enough for the probes, and describe it.

    ``all_heads``: an encoder-decoder's head masks cover its encoder self-attention, decoder self-attention
    and cross-attention heads (each gated through its own ``hook_z``); otherwise, and on every decoder-only
    model, the rows are ``blocks.{l}.attn.hook_z``."""
    if not isinstance(model, torch.nn.Module) or not callable(getattr(model, "hooks", None)):
        raise AttnlabTypeError(f"model must be a hooked torch.nn.Module (HookedRootModule or TransformerBridge) with a "
                               f"hooks() context manager, got {type(model).__name__}")
    hook_dict = getattr(model, "hook_dict", None)
    if not isinstance(hook_dict, dict):
        raise AttnlabTypeError(f"model {type(model).__name__} has no hook_dict: expected a HookedRootModule "
                               f"with setup() "
                        f"called, or a TransformerBridge")
    # The one protocol checker (cfg fields and values, hook_dict), on the adapter a bridge gets. No smoke
    # forward pass (forward=False): a probe refuses bad input before any forward pass, and it adapts to a
    # forward without attention_mask.
    check_protocol(BridgeAdapter(model) if is_bridge(model) else model, hooks=False, forward=False)
    cfg = model.cfg
    values = {name: getattr(cfg, name) for name in ("n_layers", "n_heads", "d_vocab")}
    seq2seq = is_encoder_decoder(model)
    if all_heads and seq2seq and not isinstance(getattr(cfg, "n_encoder_layers", None), int):
        raise AttnlabTypeError(f"model {type(model).__name__} declares cfg.is_encoder_decoder but no integer "
                               f"cfg.n_encoder_layers: expected the encoder's depth")
    rows = _rows(cfg, all_heads, seq2seq)
    needed = list(rows["z_hooks"])
    if need_pattern:
        needed += list(rows["pattern_hooks"])
    missing = [name for name in needed if name not in hook_dict]
    if missing:
        raise AttnlabTypeError(f"model {type(model).__name__} lacks hook point(s) {missing[:4]}: the probes "
                               f"gate heads on "
                        f"blocks.{{l}}.attn.hook_z (an encoder-decoder's also on encoder.blocks.{{l}}.attn.hook_z "
                        f"and blocks.{{l}}.cross_attn.hook_z) and read blocks.{{l}}.attn.hook_pattern (and the "
                        f"encoder's and cross-attention's)")
    attention_dir = getattr(cfg, "attention_dir", "causal")
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        params = MappingProxyType({})
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return ModelInfo(
        n_layers=len(rows["z_hooks"]), n_heads=values["n_heads"],
        d_vocab=values["d_vocab"],
        causal=attention_dir != "bidirectional", device=device,
        takes_attention_mask="attention_mask" in params,
        # TransformerLens's bridge re-runs blocks 0..k-1 under start_at_layer, so reuse saves nothing there
        prefix_reuse="start_at_layer" in params and "stop_at_layer" in params and not is_bridge(model),
        hook_points={name: hook_dict[name] for name in needed},
        d_model=int(getattr(cfg, "d_model", 0) or 0), **rows,
    )


@dataclass
class ProbeData:
    """Tokens and masks on the model's device.

    ``weights[i, t]`` (float ``[n, pos-1]``) is 1 where the prediction made at position t of
    sequence i (of token t+1) counts towards the loss, 0 elsewhere.
    """

    tokens: Int[Tensor, "n pos"]
    attention_mask: Optional[Bool[Tensor, "n pos"]]  # None: every token real
    weights: Float[Tensor, "n pos-1"]
    # an encoder-decoder's source (the forward's source_tokens/source_mask); None: the model's default source
    source_tokens: Optional[Int[Tensor, "n src_pos"]] = None
    source_mask: Optional[Bool[Tensor, "n src_pos"]] = None  # None: every source token real

    @property
    def n(self) -> int:
        return self.tokens.shape[0]

    @property
    def pos(self) -> int:
        return self.tokens.shape[1]

    def real(self) -> Tensor:
        """bool ``[n, pos]``: which tokens are real (not padding)."""
        if self.attention_mask is None:
            return torch.ones_like(self.tokens, dtype=torch.bool)
        return self.attention_mask

    def source_real(self) -> Tensor:
        """bool ``[n, src_pos]``: which source tokens are real; ``[n, 1]`` ones without a source (the model's default
        one-token source)."""
        if self.source_tokens is None:
            return torch.ones(self.n, 1, dtype=torch.bool, device=self.tokens.device)
        if self.source_mask is None:
            return torch.ones_like(self.source_tokens, dtype=torch.bool)
        return self.source_mask.bool()

    def source(self, rows: slice | Tensor) -> dict[str, Tensor]:
        """The forward's source keywords for ``rows`` of the data (empty without a source)."""
        if self.source_tokens is None:
            return {}
        out = {SOURCE_INPUTS[0]: self.source_tokens[rows]}
        if self.source_mask is not None:
            out[SOURCE_INPUTS[1]] = self.source_mask[rows]
        return out


def probe_data(info: ModelInfo, tokens: Any, *, loss_mask: Any = None, attention_mask: Any = None,
            need_loss: bool = True, source_tokens: Any = None, source_mask: Any = None) -> ProbeData:
    """Validate tokens and masks and move them to the model's device.

    ``loss_mask[i, t]`` marks token t as a target: it counts when predicted from position t-1
    (column 0 has no prediction and is ignored). ``None`` counts every target. ``source_tokens``
    ``[n, src_pos]`` and ``source_mask`` (1 real, 0 padding): an encoder-decoder's source, row for row
    (``tokens`` are then the decoder's input); only for a model ``model_info(all_heads=True)`` read as one.
    """
    check_tokens(tokens, info.d_vocab, min_pos=2 if need_loss else 1)
    shape = tuple(tokens.shape)
    am = check_mask(attention_mask, *shape)
    if am is not None and not info.takes_attention_mask:
        raise AttnlabError("attention_mask was given but the model's forward takes no attention_mask argument")
    lm = check_mask(loss_mask, *shape, name="loss_mask")
    tokens = tokens.to(info.device, torch.long)
    am = None if am is None else am.to(info.device)
    if am is not None and bool(am.all()):
        am = None  # an all-ones mask is no mask (and keeps fast attention paths)
    target = torch.ones(shape[0], shape[1] - 1, dtype=torch.bool, device=info.device) if shape[1] > 1 else \
        torch.zeros(shape[0], 0, dtype=torch.bool, device=info.device)
    if lm is not None:
        target = target & lm.to(info.device)[:, 1:]
    if am is not None:  # a prediction needs a real input token and a real target
        target = target & am[:, 1:] & am[:, :-1]
    if need_loss and not bool(target.any()):
        raise AttnlabError("loss_mask selects no target: expected at least one position t >= 1 with loss_mask[:, t]=1 "
                           "(and real tokens at t-1 and t)")
    src, src_mask = _source(info, source_tokens, source_mask, shape[0])
    return ProbeData(tokens=tokens, attention_mask=am, weights=target.float(), source_tokens=src, source_mask=src_mask)


def probe_inputs(model: AnyModel, tokens: Any, *, all_heads: bool = False, need_pattern: bool = False,
                 need_loss: bool = True, loss_mask: Any = None, attention_mask: Any = None, source_tokens: Any = None,
                 source_mask: Any = None) -> tuple[ProtocolModel, ModelInfo, ProbeData]:
    """What a probe starts from, all checked: the model, what it knows of it (:func:`model_info`) and its data
    (:func:`probe_data`, with these keywords).

    The model comes back typed as a :class:`ProtocolModel`, which :func:`model_info` has just checked it is."""
    info = model_info(model, need_pattern=need_pattern, all_heads=all_heads)
    data = probe_data(info, tokens, loss_mask=loss_mask, attention_mask=attention_mask, need_loss=need_loss,
                      source_tokens=source_tokens, source_mask=source_mask)
    return cast(ProtocolModel, model), info, data


def _source(info: ModelInfo, source_tokens: Any, source_mask: Any, n: int) -> tuple[Optional[Tensor], Optional[Tensor]]:
    if source_tokens is None and source_mask is None:
        return None, None
    if not info.encoder_decoder:
        raise AttnlabError("source_tokens/source_mask were given but the model is not an encoder-decoder "
                           "(cfg.is_encoder_decoder is not True): expected neither")
    if source_tokens is None:
        raise AttnlabError("source_mask was given without source_tokens: expected both or neither")
    mask = check_source(source_tokens, source_mask, n, info.d_vocab)
    src = cast(Tensor, source_tokens).to(info.device, torch.long)
    if mask is not None and bool(mask.all()):
        mask = None  # an all-ones mask is no mask
    return src, None if mask is None else mask.to(info.device)


def check_batch_size(batch_size: Any) -> Optional[int]:
    return check_positive_int("batch_size", batch_size, none_ok=True)


def check_tolerance(tolerance: Any) -> float:
    return float(check_number("tolerance", tolerance, 0, 1, high_inclusive=False,
                              expected="a relative loss increase in (0, 1)"))


def check_orders(order: Any) -> tuple[str, ...]:
    orders = (order,) if isinstance(order, str) else order
    if not isinstance(orders, (tuple, list)) or not orders:
        raise AttnlabError(f"order={order!r} is invalid: expected one of {list(ORDERS)} or a sequence of them")
    for o in orders:
        check_choice("order", o, ORDERS)
    return tuple(dict.fromkeys(orders))


def check_seeds(seeds: Any) -> tuple[int, ...]:
    return tuple(dict.fromkeys(check_ints("seeds", seeds, 0)))


def check_fractions(fractions: Any) -> tuple[float, ...]:
    if fractions is None:
        return tuple(i / 10 for i in range(11))
    values = check_sequence("fractions", fractions, "a non-empty sequence of numbers in [0, 1]")
    for f in values:
        if not is_number(f) or math.isnan(f) or not 0 <= f <= 1:
            raise AttnlabError(f"fraction {f!r} in fractions is invalid: expected a number in [0, 1]")
    return tuple(float(f) for f in values)


def check_threshold(name: str, value: Any) -> float:
    return float(check_number(name, value, 0, 1, expected="a probability in (0, 1]"))
