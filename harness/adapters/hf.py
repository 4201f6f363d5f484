"""HFAdapter: any Hugging Face ``PreTrainedModel`` (causal or masked LM) behind the model protocol.

The adapter observes the model and never reimplements it: ``forward`` calls the model's own
forward, so its logits are the model's (a user's patch of the modeling code stays visible).
Hook points are fired from the model's modules (see :mod:`harness.adapters.hf_routes` for the
two routes): decoder-layer inputs and outputs give ``hook_resid_pre``/``hook_resid_post``, the
attention function registered with transformers' AttentionInterface (or module hooks on older
architectures) gives the attention hooks. A hook that returns a tensor replaces the activation
in the model, as in TransformerLens. The model's declared design is ``cfg``
(:class:`~harness.adapters.design_facts.AdapterConfig`, read by :mod:`harness.adapters.hf_design`).

The adapter points the wrapped model at ``attnlab_<kernel>`` (its attention implementation) and
hooks its modules: wrap a model you do not need unwrapped afterwards, and wrap it once.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from typing import Any, Optional, cast

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from harness.adapters import hf_attention as attention
from harness.adapters import hf_partial as partial
from harness.adapters import hf_routes as routes
from harness.adapters.design_facts import AdapterConfig
from harness.adapters.hf_design import calls, head_dim, position_embedding_module, read_design
from harness.adapters.protocol import UnsupportedInput, smoke_forward
from harness.errors import AttnlabTypeError
from harness.model.hooks import active
from harness.model.inputs import check_inputs, check_mask, check_table_positions, check_tokens
from harness.model.positions import mask_positions
from harness.model.protocol_facts import ADDED_POSITIONS

ATTN_POINTS = ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_attn_scores", "hook_pattern", "hook_z")


class _Attn(nn.Module):
    hook_q: HookPoint
    hook_k: HookPoint
    hook_v: HookPoint
    hook_rot_q: HookPoint
    hook_rot_k: HookPoint
    hook_attn_scores: HookPoint
    hook_pattern: HookPoint
    hook_z: HookPoint

    def __init__(self) -> None:
        super().__init__()
        for name in ATTN_POINTS:  # q/k/v/rot/z: [batch, pos, n_heads, d_head]; scores/pattern: [batch, n_heads, q, k]
            setattr(self, name, HookPoint())


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.attn = _Attn()


class _LnFinal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]


def _first(output: Any) -> Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output  # OpenAI GPT's blocks return lists


def _replace_first(output: Any, tensor: Tensor) -> Any:
    if isinstance(output, (tuple, list)):
        return type(output)([tensor, *output[1:]])
    return tensor


def _is_pretrained(model: Any) -> bool:
    # A PreTrainedModel exists only once transformers.modeling_utils is loaded; importing it costs ~1.7 s,
    # which every entry point would pay for a model that is not one.
    module = sys.modules.get("transformers.modeling_utils")
    return module is not None and isinstance(model, module.PreTrainedModel)


def _is_cache(value: Any) -> bool:
    """A transformers ``Cache`` (by its class's module: importing cache_utils here costs an import of transformers)."""
    return any(c.__module__ == "transformers.cache_utils" and c.__name__ == "Cache" for c in type(value).__mro__)


class HFAdapter(HookedRootModule):
    """A ``transformers.PreTrainedModel`` behind the protocol's ``forward``, ``cfg`` and hook names.

    ``adapter.route`` says how the attention hooks are reached ("attention_interface" or
    "module_hooks"); ``adapter.hf_model`` is the wrapped model.
    """

    # set in __init__/_install; Hugging Face module trees are untyped (nn.Module.__getattr__), so Any
    hf_model: Any
    _layers: Any
    _stack: Any
    _attns: list[Any]
    _outs: list[Any]
    _handles: list[Any]

    def __init__(self, hf_model: Any):
        super().__init__()
        if not _is_pretrained(hf_model):
            raise AttnlabTypeError(f"HFAdapter expects a transformers.PreTrainedModel, got {type(hf_model).__name__}")
        config = hf_model.config
        arch = getattr(config, "model_type", type(hf_model).__name__)
        supported = ", ".join(routes.TABLE_ARCHS)
        stack = routes.find_layers(hf_model, getattr(config.get_text_config(), "num_hidden_layers", None))
        # a hybrid stack (Mamba, gated DeltaNet, short-conv blocks between attention blocks): its attention blocks are
        # the protocol's blocks, in order; layer_ids maps block l to the model's layer (the others are not hooked)
        self.layer_ids = routes.attention_layer_ids(stack) if stack is not None else []
        layers = [stack[i] for i in self.layer_ids] if stack is not None else []
        attns = [routes.attention_module(layer) for layer in layers]
        if getattr(config, "is_encoder_decoder", False) or not layers or any(a is None for a in attns):
            raise AttnlabTypeError(f"architecture {arch!r} ({type(hf_model).__name__}) is not supported by "
                                   f"HFAdapter: it "
                            f"has no stack of attention blocks the adapter can find (encoder-decoders: adapt() or "
                            f"HFSeq2SeqAdapter); supported architectures: {supported}")
        self.hf_model = hf_model.eval()
        self._stack, self._layers, self._attns = stack, layers, attns
        self._outs = [routes.out_projection(layer) for layer in layers]
        d_head = head_dim(cast(nn.Module, attns[0]), config)
        self._cfg = read_design(hf_model, attns, d_head, layer_ids=self.layer_ids)
        self.route = self._choose_route(hf_model, attns)
        if self.route == routes.MODULE_HOOKS and any(o is None for o in self._outs):
            raise AttnlabTypeError(f"architecture {arch!r} does not dispatch through transformers' "
                                   f"AttentionInterface and "
                            f"has no attention output projection to hook; supported architectures: {supported}")
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([_Block() for _ in layers])
        self.ln_final = _LnFinal()
        self._params = set(inspect.signature(hf_model.forward).parameters)
        self._taps: list[attention.LayerTap] = []
        previous = hf_model.__dict__.get("_attnlab_adapter")
        if previous is not None:  # one adapter per model: the older one stops observing
            previous.detach()
        self._install()
        self.setup()
        with partial.output_shapes(cast(nn.ModuleList, stack)) as shapes:
            self._smoke(arch)
        self._layer_shapes = shapes  # what each layer returns: the pass-through of a partial run mimics it
        self._observe_rotary_layers()
        hf_model.__dict__["_attnlab_adapter"] = self  # not a submodule: no cycle in modules()

    @classmethod
    def of(cls, hf_model: nn.Module) -> HFAdapter:
        """The adapter already wrapping ``hf_model``, or a new one (what :func:`harness.adapters.adapt` uses)."""
        existing = getattr(hf_model, "__dict__", {}).get("_attnlab_adapter")
        return existing if isinstance(existing, cls) and existing._handles else cls(hf_model)

    def detach(self) -> None:
        """Remove every hook this adapter put on the model's modules (the model keeps its attnlab_* kernel name)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for attn in self._attns:
            if attention.TAPS.get(attn) in self._taps:
                del attention.TAPS[attn]

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> HFAdapter:
        return cls(hf_model)

    @property
    def cfg(self) -> AdapterConfig:
        return self._cfg

    def _choose_route(self, hf_model: Any, attns: list) -> str:
        if not all(routes.uses_interface(a) for a in attns):
            return routes.MODULE_HOOKS
        current = hf_model.config._attn_implementation or "sdpa"
        base = attention.base_kernel(current)
        name = routes.register_kernel(base)
        if current != name:
            hf_model.set_attn_implementation(name)
        if hf_model.config._attn_implementation != name:
            return routes.MODULE_HOOKS
        self._base = base
        return routes.INTERFACE

    # ---- wiring the model's modules to the hook points -------------------------------------------------
    def _install(self) -> None:
        hf, cfg = self.hf_model, self._cfg
        self._handles = []
        self._handles.append(hf.get_input_embeddings().register_forward_hook(self._out_hook(self.hook_embed)))
        table = position_embedding_module(hf)
        # whether the table adds its own offset to the ids (OPT): read once here, not per forward (a walk of
        # every module; ~2% of a tiny model's pass)
        self._table_offsets = isinstance(getattr(table, "offset", None), int)
        if table is not None and cfg.positional_embedding_type in ADDED_POSITIONS:
            self._handles.append(table.register_forward_hook(self._out_hook(self.hook_pos_embed)))
        # RoFormer's forward takes no position_ids but its sinusoidal table does: a position offset reaches the
        # table (and so the rotation) through it; the table still computes the angles itself
        self._table_ids: Optional[Tensor] = None
        self._offset_table = table is not None and "position_ids" not in self._params and \
            "position_ids" in inspect.signature(table.forward).parameters
        if self._offset_table and table is not None:
            self._handles.append(table.register_forward_pre_hook(self._table_hook, with_kwargs=True))
        norm = routes.final_norm(hf, self._stack)
        if norm is not None:
            self._handles.append(norm.register_forward_hook(self._out_hook(self.ln_final.hook_normalized)))
        parts = zip(self._layers, self._attns, self._outs, cast(list[_Block], list(self.blocks)), strict=True)
        for layer, (module, attn, out, block) in enumerate(parts):
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(block.hook_resid_pre),
                                                                  with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._out_hook(block.hook_resid_post)))
            if out is not None:
                self._handles.append(out.register_forward_hook(self._out_hook(block.hook_attn_out)))
            points = {name: getattr(block.attn, name) for name in ATTN_POINTS}
            if self.route == routes.INTERFACE:
                tap = attention.LayerTap(layer, points, self._base, cfg.positional_embedding_type == "rotary",
                                         cfg.d_head)
                attention.TAPS[attn] = tap
                self._taps.append(tap)
                if tap.rotary:
                    attention.install_rotary_tap(attn)
                self._handles.append(attn.register_forward_pre_hook(self._enter(tap)))
                self._handles.append(attn.register_forward_hook(self._leave, always_call=True))
            else:
                self._handles.append(out.register_forward_pre_hook(self._z_hook(block.attn.hook_z)))
                self._handles.append(attn.register_forward_hook(self._pattern_hook(block.attn.hook_pattern,
                                                                                   self._cfg.n_heads)))

    def _table_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        if self._table_ids is None:
            return None
        return args, {**kwargs, "position_ids": self._table_ids}

    @staticmethod
    def _enter(tap: attention.LayerTap) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            tap.entered += 1
            module.__dict__["_attnlab_token"] = attention.CURRENT.set(tap)
        return hook

    @staticmethod
    def _leave(module: nn.Module, args: Any, output: Any) -> None:
        token = module.__dict__.pop("_attnlab_token", None)
        if token is not None:
            attention.CURRENT.reset(token)

    @staticmethod
    def _out_hook(point: HookPoint) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            if not active(point):
                return None
            x = _first(output)
            y = point(x)
            return None if y is x else _replace_first(output, y)
        return hook

    @staticmethod
    def _pre_hook(point: HookPoint) -> Any:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> Any:
            if not active(point):
                return None
            if args:
                y = point(args[0])
                return None if y is args[0] else ((y, *args[1:]), kwargs)
            x = kwargs["hidden_states"]
            y = point(x)
            return None if y is x else (args, {**kwargs, "hidden_states": y})
        return hook

    def _z_hook(self, point: HookPoint) -> Any:
        n_heads = self._cfg.n_heads

        def hook(module: nn.Module, args: tuple) -> Any:
            if not active(point):
                return None
            merged = args[0]  # [batch, pos, n_heads * d_head]
            y = point(merged.unflatten(-1, (n_heads, -1)))
            return (y.flatten(-2), *args[1:])
        return hook

    @staticmethod
    def _pattern_hook(point: HookPoint, n_heads: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            # read-only: the pattern was already used by the time the module returns it. Only a
            # [batch, n_heads, query, key] square is the protocol's pattern: Longformer's module returns its
            # banded local attention, [batch, pos, n_heads, 2w + 1], which must not be read as one (the hook
            # stays silent and the rows that need it say unobservable).
            weights = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            if active(point) and isinstance(weights, Tensor) and weights.ndim == 4 and weights.shape[1] == n_heads \
                    and weights.shape[-1] == weights.shape[-2]:
                point(weights)
        return hook

    # ---- forward --------------------------------------------------------------------------------------
    def position_ids(self, mask: Int[Tensor, "batch pos"], position_offset: int) -> Int[Tensor, "batch pos"]:
        """The ids passed to the model: the protocol's positions (+ the table offset it expects)."""
        ids = mask_positions(mask, position_offset, mask.shape[-1], mask.device)
        # OPT adds its offset to the ids it is given; RoBERTa-style tables expect ids already offset
        if self._cfg.pos_offset and not self._table_offsets:
            ids = ids + self._cfg.pos_offset
        return ids

    def forward(self, tokens: Tensor, attention_mask: Optional[Tensor] = None, position_offset: int = 0, *,
                start_at_layer: Optional[int] = None, stop_at_layer: Optional[int] = None
                ) -> Float[Tensor, "batch pos d_vocab"] | Float[Tensor, "batch pos d_model"]:
        """Logits; TransformerLens's partial runs as attnlab's Transformer has them (harness/adapters/hf_partial.py):
        ``stop_at_layer=l`` returns the residual entering block l, ``start_at_layer=l`` takes it for the tokens."""
        if start_at_layer is None and stop_at_layer is None:
            return self._forward(tokens, attention_mask, position_offset)
        cfg = self._cfg
        return partial.partial_forward(
            lambda t: self._forward(t, attention_mask, position_offset), tokens, n_layers=cfg.n_layers,
            d_model=cfg.d_model, stack=self._stack, layer_ids=self.layer_ids,
            shapes=self._layer_shapes, start=start_at_layer, stop=stop_at_layer)

    def _forward(self, tokens: Tensor, attention_mask: Optional[Tensor],
                 position_offset: int) -> Float[Tensor, "batch pos d_vocab"]:  # inputs: check_inputs validates
        cfg = self._cfg
        tokens, real, position_offset = check_inputs(tokens, attention_mask, position_offset, cfg.d_vocab)
        mask = torch.ones_like(tokens) if real is None else real.long()
        kwargs: dict[str, Any] = {"attention_mask": mask}
        ids = self.position_ids(mask, position_offset)
        if "position_ids" in self._params:
            if cfg.positional_embedding_type == "standard":
                check_table_positions(ids - cfg.pos_offset, cfg.n_ctx)
            kwargs["position_ids"] = ids
        elif position_offset and self._offset_table:
            # numbered by index from the offset, as the model numbers its own positions (left padding moves them;
            # only rotary tables take this path, and rotary scores see only differences of positions)
            self._table_ids = position_offset + torch.arange(tokens.shape[1], device=tokens.device)
        elif position_offset and cfg.positional_embedding_type not in ("alibi", "none"):
            # a valid protocol input this adapter cannot pass on: the check that needs it is unobservable, not failed
            raise UnsupportedInput(f"position_offset={position_offset} cannot be given to {cfg.arch}: its forward "
                                   f"takes no position_ids; expected position_offset=0")
        # alibi models without position_ids (Bloom, MPT) number keys from the mask; an offset would shift every
        # key of a query by the same slope * offset, which softmax cannot see, so it is dropped exactly.
        if "use_cache" in self._params:
            kwargs["use_cache"] = False
        if self.route == routes.MODULE_HOOKS and "output_attentions" in self._params and \
                any(active(b.attn.hook_pattern) for b in cast(list[_Block], list(self.blocks))):
            kwargs["output_attentions"] = True
        try:
            return self.hf_model(input_ids=tokens, **kwargs).logits
        finally:
            self._table_ids = None

    # ---- cached decoding through the model's own cache (harness.adapters.protocol.CachedDecoding) -------
    def _cache_param(self) -> Optional[str]:
        for name in ("cache", "past_key_values"):  # transformers 5 renamed past_key_values to cache
            if name in self._params and "use_cache" in self._params:
                return name
        return None

    def __getattr__(self, name: str) -> Any:
        # forward_with_cache exists only where the model has a cache to decode through (the kv_cache
        # property is n/a elsewhere, not a failure)
        if name == "forward_with_cache":
            if self._cfg.attention_dir == "causal" and self._cache_param() is not None:
                return self._forward_with_cache
            raise AttributeError(f"{self._cfg.arch} has no cache to decode through")
        return super().__getattr__(name)

    def _forward_with_cache(self, tokens: Tensor, attention_mask: Optional[Tensor] = None,
                            past: Optional[tuple[Any, Tensor]] = None) -> tuple[Tensor, tuple[Any, Tensor]]:
        """Logits of the new ``tokens`` through the model's own cache (its ``past_key_values``), and the
        cache to pass next: ``(hf_cache, mask so far)``. ``attention_mask`` covers the new tokens only."""
        check_tokens(tokens, self._cfg.d_vocab)
        real = check_mask(attention_mask, *tokens.shape)
        new = torch.ones_like(tokens) if real is None else real.long()
        if past is not None and not (isinstance(past, tuple) and len(past) == 2):
            raise AttnlabTypeError(f"past must be None or what forward_with_cache returned, got {type(past).__name__}")
        cache, seen = (None, new[:, :0]) if past is None else past
        mask = torch.cat((seen, new), 1)
        kwargs: dict[str, Any] = {"attention_mask": mask, "use_cache": True, self._cache_param() or "cache": cache}
        if "position_ids" in self._params:
            kwargs["position_ids"] = self.position_ids(mask, 0)[:, -tokens.shape[1]:]
        made: list[Any] = []  # the cache the model makes for itself on a first call, as its first layer is given it
        handle = None if cache is not None else self._layers[0].register_forward_pre_hook(
            lambda module, args, kw: made.extend(a for a in (*args, *kw.values()) if _is_cache(a)), with_kwargs=True)
        try:
            out = self.hf_model(input_ids=tokens, **kwargs)
        finally:
            if handle is not None:
                handle.remove()
        returned = getattr(out, "cache", None) if hasattr(out, "cache") else getattr(out, "past_key_values", None)
        if returned is None and made:
            # RecurrentGemma's CausalLMOutput has no cache field: the DynamicCache it made (and set its recurrent
            # states up with) is the one to continue from, or each step restarts from an empty cache
            returned = made[0]
        return out.logits, (returned if returned is not None else cache, mask)

    def _observe_rotary_layers(self) -> None:
        """``cfg.rotary_layers`` from the smoke pass: where some layers' rotary function ran and others' did not.

        Where the modeling code calls apply_rotary_pos_emb but no checked layer ran it, the stack has no positions
        at all: Cohere 2 rotates its sliding-window layers only, so a config of full-attention layers alone is
        position-free (``positional_embedding_type="none"``)."""
        if self._cfg.positional_embedding_type != "rotary" or len(self._taps) != self._cfg.n_layers:
            return
        turned = tuple(tap.rotations > 0 for tap in self._taps)
        module = sys.modules.get(type(self._attns[0]).__module__)
        if any(turned) and not all(turned):
            self._cfg = dataclasses.replace(self._cfg, rotary_layers=turned)
        elif (all(tap.entered and not tap.rotary_calls for tap in self._taps)
              and (self._cfg.rotary_dim or self._cfg.d_head) == self._cfg.d_head
              and isinstance(getattr(module, "apply_rotary_pos_emb", None), attention.RotaryTap)
              and calls(module, "apply_rotary_pos_emb")):
            # every layer ran under the adapter, the design rotates whole heads (a partial rotary_dim may go through
            # another function: DeepSeek-V3's MLA rotates its rope slice with apply_rotary_pos_emb_interleave), the
            # rotary function was watched (tapped: a (q, k, ...) function; GPT-J's (tensor, sin, cos) is not) and no
            # layer called it at all (another head size, Gemma 4's global layers, still counts as a call)
            self._cfg = dataclasses.replace(self._cfg, positional_embedding_type="none", rotary_dim=None,
                                            rotary_style=None, rotary_base=None, rotary_offset=None,
                                            rotary_direction=None, rope_type=None)

    def _smoke(self, arch: str) -> None:
        """A plain two-token forward before any use: a model that raises gets one error naming the exception."""
        label = f"{arch} model ({type(self.hf_model).__name__})"
        problems, _ = smoke_forward(self, label=label)
        if problems:
            raise AttnlabTypeError(f"{label}: {'; '.join(problems)} (expected a causal or masked LM head)")
