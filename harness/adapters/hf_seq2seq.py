"""HFSeq2SeqAdapter: a Hugging Face encoder-decoder (BART, mBART, Marian, Pegasus, T5 ...) behind the protocol.

The encoder-decoder part of the model protocol (docs/architecture.md, "Encoder-decoders"), as our own
:class:`~harness.model.seq2seq.EncoderDecoder` follows it: ``cfg`` describes the (causal) decoder and
declares ``is_encoder_decoder`` and ``n_encoder_layers``; ``forward(tokens, attention_mask,
position_offset, *, source_tokens, source_mask)`` calls the model's own forward (``input_ids`` = the
source, ``decoder_input_ids`` = ``tokens``), so the logits are the model's. Without a source, each row
reads a one-token source of id ``DEFAULT_SOURCE_ID``, so the decoder-only properties check the decoder.

Hooks come from the model's modules by :class:`~harness.adapters.hf.HFAdapter`'s interface route
(transformers' AttentionInterface): decoder self-attention at ``blocks.{l}.attn.*``, cross-attention at
``blocks.{l}.cross_attn.*``, the encoder under ``encoder.``. Cross-attention is told from self-attention
by the module (its name or a ``CrossAttention`` parent), never by key length. Its ``hook_k``/``hook_v``
fire from the key/value projections, so they fire only when K/V are computed: during cached decoding
transformers' ``EncoderDecoderCache`` reads them back and they stay silent (the ``cross_kv_cache`` row).
GPT-2's cross-attention (the decoder of a bert2gpt2 ``EncoderDecoderModel``) projects K and V with one fused
``c_attn`` that its forward splits at ``split_size``: the hooks split that output the same way. A cross-attention
whose K/V projections the adapter cannot find keeps no ``hook_k``/``hook_v`` (``adapter.unhooked`` says why): only
the rows that need them are unobservable, naming the hook; every other row runs.

Positions follow the protocol's rule (a position counts the real tokens before it): BART-style tables
number tokens by index, so where that differs (left padding, an offset) the adapter calls the model's own
table module once per row with that row's ids. T5's relative bias sees only differences and needs none. A bare
``nn.Embedding`` table (BERT, GPT-2, RoBERTa inside an ``EncoderDecoderModel``) takes the ids as its input: they
are given in the model's numbering, from 0, or from ``padding_idx + 1`` where the table keeps a padding row
(RoBERTa numbers positions from its token ids, fairseq's make_positions, so its rows are always given the ids).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, fields
from typing import Any, Optional, cast

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from harness.adapters import hf_attention as attention
from harness.adapters import hf_routes as routes
from harness.adapters.design_facts import AdapterConfig
from harness.adapters.hf import HFAdapter, _LnFinal
from harness.adapters.hf_design import head_dim, position_embedding_module, read_design
from harness.adapters.protocol import UnsupportedInput, smoke_forward
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.hooks import active
from harness.model.inputs import check_inputs, check_mask, check_source, check_table_positions, check_tokens
from harness.model.positions import mask_positions
from harness.model.protocol_facts import ADDED_POSITIONS, CROSS_ATTN_HOOKS, cross_attn_hook
from harness.model.seq2seq import DEFAULT_SOURCE_ID

SELF_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")
# How modeling files name a decoder layer's cross-attention module (BART's encoder_attn, T5's EncDecAttention).
CROSS_NAME = re.compile(r"encoder_attn|encdecattention|cross_?att", re.IGNORECASE)
QUERY_NAMES, KEY_NAMES, VALUE_NAMES = ("q_proj", "query", "q"), ("k_proj", "key", "k"), ("v_proj", "value", "v")
# GPT-2's cross-attention: one Conv1D ``c_attn`` of width 2 * split_size whose output its forward splits into K, V
# (``self.c_attn(encoder_hidden_states).split(self.split_size, dim=2)``; the query has its own ``q_attn``)
FUSED_KV_NAMES = ("c_attn",)
# How attention modules name their head count and width (BART num_heads/head_dim, T5 n_heads/key_value_proj_dim).
HEAD_COUNT_NAMES, HEAD_DIM_NAMES = ("num_heads", "n_heads", "num_attention_heads"), \
    ("head_dim", "key_value_proj_dim", "attention_head_size", "head_size")
OUT_NAMES = (*routes.OUT_PROJ_NAMES, "o")  # T5 names its output projection o
ENCODER, DECODER = "encoder", "decoder"


@dataclass(frozen=True, kw_only=True)
class Seq2SeqAdapterConfig(AdapterConfig):
    """:class:`AdapterConfig` of the decoder plus the encoder-decoder part of the protocol."""

    n_encoder_layers: int
    # The encoder's own heads (BART's encoder_attention_heads may differ from decoder_attention_heads): the hooks
    # under ``encoder.`` are [batch, src_pos, n_encoder_heads, d_encoder_head]; n_heads/d_head are the decoder's.
    n_encoder_heads: Optional[int] = None
    d_encoder_head: Optional[int] = None
    is_encoder_decoder: bool = True


def is_hf_encoder_decoder(model: Any) -> bool:
    """Whether a ``PreTrainedModel`` declares itself an encoder-decoder (its config's ``is_encoder_decoder``)."""
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


class _Points(nn.Module):
    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__()
        for name in names:  # q/k/v/z: [batch, pos, n_heads, d_head]; scores/pattern: [batch, n_heads, q, k]
            setattr(self, name, HookPoint())


class _Block(nn.Module):
    attn: nn.Module
    cross_attn: nn.Module

    def __init__(self, cross: bool) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.attn = _Points(SELF_HOOKS)
        if cross:
            self.cross_attn = _Points(CROSS_ATTN_HOOKS)  # k/v: [batch, src_pos, n_heads, d_head]
            self.hook_cross_attn_out = HookPoint()  # [batch, pos, d_model]


class _Stack(nn.Module):
    def __init__(self, n_layers: int, cross: bool, positions: bool) -> None:
        super().__init__()
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        if positions:
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([_Block(cross) for _ in range(n_layers)])


@dataclass
class _Past:
    """What ``forward_with_cache`` hands back: the model's cache, the encoder's output and both masks so far."""

    cache: Any
    encoder_outputs: Any
    source_mask: Tensor  # long [batch, src_pos]
    mask: Tensor  # long [batch, pos so far]


def _is_bare(table: nn.Module) -> bool:
    """A plain ``nn.Embedding`` lookup (BERT's, GPT-2's, RoBERTa's table): its input is the ids themselves, in the
    model's numbering; BART's and Marian's tables are subclasses with their own forward taking ``position_ids``."""
    return isinstance(table, nn.Embedding) and type(table).forward is nn.Embedding.forward


def _ids_param(table: nn.Module) -> Optional[str]:
    """The argument of ``table``'s forward that takes the position ids, if any."""
    if "position_ids" in inspect.signature(table.forward).parameters:
        return "position_ids"
    return "input" if _is_bare(table) else None


def _first_row(table: Optional[nn.Module]) -> int:
    """The table row of position 0: a bare table that keeps a padding row (RoBERTa's padding_idx = pad_token_id)
    numbers positions from padding_idx + 1 (fairseq's make_positions); any other from 0 (or adds its offset itself)."""
    if table is None or not _is_bare(table) or cast(nn.Embedding, table).padding_idx is None:
        return 0
    return cast(int, cast(nn.Embedding, table).padding_idx) + 1


def _table_at(table: nn.Module, args: tuple, kwargs: dict, row: Tensor) -> Tensor:
    """``table``'s own forward on the call's arguments with ``position_ids`` = ``row`` (one batch row's ids; a bare
    ``nn.Embedding``'s input).

    The ids take the layout the model gave them (PEGASUS-X's decoder passes them positionally, as a column
    ``[pos, 1]``); where the model gave none, a row ``[pos]``, else a column: PEGASUS-X's table broadcasts its
    default ``arange(pos)[:, None]`` against its frequencies, and a row does not broadcast.
    """
    name = cast(str, _ids_param(table))  # _impose gave ids only to a table that takes them
    bound = inspect.signature(table.forward).bind(*args, **kwargs)
    given = bound.arguments.get(name)
    layouts = [row.reshape(given.shape)] if isinstance(given, Tensor) and given.numel() == row.numel() else \
        [row, row[:, None]]
    for i, ids in enumerate(layouts):
        bound.arguments[name] = ids
        try:
            return table.forward(*bound.args, **bound.kwargs)
        except RuntimeError:
            if i == len(layouts) - 1:
                raise
    raise AssertionError("unreachable: the last layout re-raises")


def _leaves(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The innermost attention modules inside ``module`` with their names, in module order."""
    found = [(n, m) for n, m in module.named_modules() if routes._is_attention(m)]
    return [(n, m) for n, m in found if not any(routes._is_attention(c) for c in m.modules() if c is not m)]


def _is_cross(layer: nn.Module, name: str) -> bool:
    parts = name.split(".")
    parents = [type(layer.get_submodule(".".join(parts[:i]))).__name__ for i in range(1, len(parts))]
    return bool(CROSS_NAME.search(name)) or any("CrossAttention" in p for p in parents)


def _stack_layers(part: nn.Module) -> Optional[nn.ModuleList]:
    """The outermost ModuleList of ``part`` whose every element holds an attention module (its blocks)."""
    for module in part.modules():
        if isinstance(module, nn.ModuleList) and len(module) and all(_leaves(m) for m in module):
            return module
    return None


def _width(module: Any) -> Optional[int]:
    """Output features of a projection: an ``nn.Linear``, or transformers' ``Conv1D`` (GPT-2's, weight [in, out])."""
    if isinstance(module, nn.Linear):
        return module.out_features
    nf = getattr(module, "nf", None)
    if isinstance(module, nn.Module) and type(module).__name__ == "Conv1D" and isinstance(nf, int):
        return nf
    return None


def _child(attn: nn.Module, names: tuple[str, ...]) -> Optional[nn.Module]:
    return next((getattr(attn, n) for n in names if _width(getattr(attn, n, None)) is not None), None)


def _fused_kv(attn: nn.Module) -> Optional[tuple[nn.Module, int]]:
    """GPT-2's cross-attention K/V projection and the width its forward splits it at (see FUSED_KV_NAMES); None
    where ``attn`` has no such projection (a self-attention's c_attn is 3 * split_size wide: Q, K, V)."""
    proj, split = _child(attn, FUSED_KV_NAMES), getattr(attn, "split_size", None)
    if proj is None or not isinstance(split, int) or isinstance(split, bool) or _width(proj) != 2 * split:
        return None
    return proj, split


def _out_projection(attn: nn.Module, parent: Optional[nn.Module]) -> Optional[nn.Module]:
    """The projection of ``attn``'s merged heads to d_model: its own (BART out_proj, T5 o, GPT-2 c_proj), else,
    where the module computes attention only (BertSelfAttention, BertCrossAttention), its parent's (BertAttention's
    output.dense), found as HFAdapter finds it."""
    own = _child(attn, OUT_NAMES)
    return own if own is not None or parent is None else routes.out_projection(parent)


def _int_attr(module: nn.Module, names: tuple[str, ...]) -> Optional[int]:
    values = (getattr(module, n, None) for n in names)
    return next((v for v in values if isinstance(v, int) and not isinstance(v, bool)), None)


def _head_shape(attn: nn.Module, default: tuple[int, int]) -> tuple[int, int, int]:
    """(heads, d_head, key/value heads) of one attention module: its attributes, else its projections' widths (T5Gemma
    keeps head_dim only: k_proj 32 / 16 = 2 key/value heads), else ``default``. Not the config's: BART's
    num_attention_heads is encoder_attention_heads, which the decoder need not have."""
    heads, dim = _int_attr(attn, HEAD_COUNT_NAMES), _int_attr(attn, HEAD_DIM_NAMES)
    query, key = _child(attn, QUERY_NAMES), _child(attn, KEY_NAMES)
    if dim is None:
        dim = cast(int, _width(query)) // heads if query is not None and heads else default[1]
    if heads is None:
        heads = cast(int, _width(query)) // dim if query is not None else default[0]
    kv = _int_attr(attn, ("num_key_value_heads",)) or (cast(int, _width(key)) // dim if key is not None else heads)
    return heads, dim, kv


class HFSeq2SeqAdapter(HFAdapter):
    """A ``transformers`` encoder-decoder behind the protocol (see the module docstring).

    Shares :class:`HFAdapter`'s machinery (its route, the attention function, the module hooks, ``detach``,
    ``of``), not its ``__init__``: the layout it finds is two stacks and three attentions per decoder layer.
    """

    def __init__(self, hf_model: Any):
        HookedRootModule.__init__(self)
        arch = getattr(getattr(hf_model, "config", None), "model_type", type(hf_model).__name__)
        if not is_hf_encoder_decoder(hf_model) or not callable(getattr(hf_model, "get_encoder", None)):
            raise AttnlabTypeError(f"HFSeq2SeqAdapter expects a transformers encoder-decoder (config."
                                   f"is_encoder_decoder), got {type(hf_model).__name__} ({arch!r})")
        encoder, decoder = hf_model.get_encoder(), hf_model.get_decoder()
        enc_layers, dec_layers = _stack_layers(encoder), _stack_layers(decoder)
        if encoder is hf_model or decoder is hf_model or enc_layers is None or dec_layers is None:
            raise AttnlabTypeError(f"architecture {arch!r} ({type(hf_model).__name__}): the adapter finds no "
                                   f"encoder and decoder stack of attention blocks")
        self_attns, cross_attns = [], []
        for i, layer in enumerate(dec_layers):
            kinds = [(_is_cross(layer, n), m) for n, m in _leaves(layer)]
            selfs, crosses = [m for c, m in kinds if not c], [m for c, m in kinds if c]
            if len(selfs) != 1 or len(crosses) != 1:
                raise AttnlabTypeError(f"architecture {arch!r}: decoder layer {i} has {len(selfs)} self- and "
                                       f"{len(crosses)} cross-attention modules; expected one of each")
            self_attns.append(selfs[0])
            cross_attns.append(crosses[0])
        enc_attns = [_leaves(layer)[0][1] for layer in enc_layers]
        self.hf_model = hf_model.eval()
        self._layers, self._attns = dec_layers, [*self_attns, *cross_attns, *enc_attns]
        # the config's fields (num_attention_heads) may name the encoder's heads: each stack's are read off its modules
        fallback = (hf_model.config.get_text_config().num_attention_heads, head_dim(self_attns[0], hf_model.config))
        heads, d_head, kv = _head_shape(self_attns[0], fallback)
        enc_heads, enc_d_head, _ = _head_shape(enc_attns[0], fallback)
        base = read_design(hf_model, cast(list[Optional[nn.Module]], self_attns), d_head)
        facts = {f.name: getattr(base, f.name) for f in fields(AdapterConfig)}
        relative = any(getattr(a, "has_relative_attention_bias", False) for a in self_attns)  # T5: layer 0's, shared
        facts.update(adapter="HFSeq2SeqAdapter", relative_attention_bias=relative, n_heads=heads, n_key_value_heads=kv)
        self._cfg = Seq2SeqAdapterConfig(**facts, n_encoder_layers=len(enc_layers), n_encoder_heads=enc_heads,
                                         d_encoder_head=enc_d_head)
        self.route = self._choose_route(hf_model, self._attns)
        if self.route != routes.INTERFACE:
            raise AttnlabTypeError(f"architecture {arch!r} does not dispatch its attention through transformers' "
                                   f"AttentionInterface: HFSeq2SeqAdapter has no module-hook route for "
                                   f"encoder-decoders (the hooks it needs would not fire)")
        for part, attns in ((encoder, enc_attns), (decoder, [*self_attns, *cross_attns])):
            # EncoderDecoderModel(encoder=BertModel(...), decoder=...) rebinds each part's config to the pair's copy,
            # but the part's attention modules keep the config they were built with, which set_attn_implementation
            # never reaches (BertModel has no PreTrainedModel inside): they would call sdpa directly and the
            # encoder's hooks never fire. Each module's kernel is made its part's, as set_attn_implementation meant.
            for attn in attns:
                own = getattr(attn, "config", None)
                if own is not None and own is not part.config and \
                        getattr(own, "_attn_implementation", None) != part.config._attn_implementation:
                    own._attn_implementation = part.config._attn_implementation
        self._tables = {ENCODER: position_embedding_module(encoder), DECODER: position_embedding_module(decoder)}
        # each stack's own (bert2roberta: the encoder's from 0, the decoder's from padding_idx + 1)
        self._first_rows = {part: _first_row(table) for part, table in self._tables.items()}
        added = self._cfg.positional_embedding_type in ADDED_POSITIONS
        stack = _Stack(len(dec_layers), True, added and self._tables[DECODER] is not None)
        self.hook_embed, self.blocks = stack.hook_embed, stack.blocks
        if hasattr(stack, "hook_pos_embed"):
            self.hook_pos_embed = stack.hook_pos_embed
        self.encoder = _Stack(len(enc_layers), False, added and self._tables[ENCODER] is not None)
        self._params = set(inspect.signature(hf_model.forward).parameters)
        self._taps: list[attention.LayerTap] = []
        self._part = DECODER  # which stack is running (an embedding both stacks share fires the right hook)
        self._ids: dict[str, Optional[Tensor]] = {ENCODER: None, DECODER: None}  # per-row positions to impose
        self._batch = 1  # rows of the running forward (a table that returns [pos, d_model] does not say)
        previous = hf_model.__dict__.get("_attnlab_adapter")
        if previous is not None:
            previous.detach()
        self._handles = []
        # hook name -> why the adapter cannot fire it (a cross-attention whose K/V projections it cannot find)
        self.unhooked: dict[str, str] = {}
        self._parents = {id(c): p for p in hf_model.modules() for c in p.children()}
        self._wire(encoder, decoder, enc_layers, enc_attns, self_attns, cross_attns)
        self.setup()
        # the adapter reads as the model's mode (eval): check_model puts a model back in the mode it found it in,
        # and an adapter left in nn.Module's default train mode would switch the model's dropout on afterwards
        self.eval()
        label = f"{arch} model ({type(hf_model).__name__})"
        problems, _ = smoke_forward(self, label=label)
        if problems:
            raise AttnlabTypeError(f"{label}: {'; '.join(problems)} (expected a sequence-to-sequence LM head)")
        hf_model.__dict__["_attnlab_adapter"] = self

    # ---- wiring ---------------------------------------------------------------------------------------
    def _wire(self, encoder: Any, decoder: Any, enc_layers: nn.ModuleList, enc_attns: list,
              self_attns: list, cross_attns: list) -> None:
        hook = self._handles.append
        for part, module in ((ENCODER, encoder), (DECODER, decoder)):
            hook(module.register_forward_pre_hook(self._enter_part(part)))
            hook(module.register_forward_hook(self._leave_part, always_call=True))
        embeddings = {id(m): m for m in (encoder.get_input_embeddings(), decoder.get_input_embeddings())}
        for embedding in embeddings.values():
            hook(embedding.register_forward_hook(self._by_part("hook_embed")))
        for part, table in self._tables.items():
            if table is not None:
                hook(table.register_forward_hook(self._position_hook(part), with_kwargs=True))
        norm = routes.final_norm(decoder, self._layers)
        if norm is not None:
            self.ln_final = _LnFinal()
            hook(norm.register_forward_hook(self._out_hook(self.ln_final.hook_normalized)))
        d_encoder_head = cast(Seq2SeqAdapterConfig, self._cfg).d_encoder_head
        stacks = ((self.encoder.blocks, enc_layers, enc_attns, [None] * len(enc_attns), d_encoder_head),
                  (self.blocks, self._layers, self_attns, cross_attns, self._cfg.d_head))
        for blocks, layers, attns, crosses, d_head in stacks:
            parts = zip(cast(list[_Block], list(blocks)), layers, attns, crosses, strict=True)
            for i, (block, layer, attn, cross) in enumerate(parts):
                hook(layer.register_forward_pre_hook(self._pre_hook(block.hook_resid_pre), with_kwargs=True))
                hook(layer.register_forward_hook(self._out_hook(block.hook_resid_post)))
                self._tap(i, attn, block.attn, block.hook_attn_out, cast(int, d_head))
                if cross is not None:
                    self._tap(i, cross, block.cross_attn, block.hook_cross_attn_out, cast(int, d_head), own_kv=True)

    def _tap(self, layer: int, attn: nn.Module, points: nn.Module, out_point: HookPoint, d_head: int,
             own_kv: bool = False) -> None:
        """Point ``attn``'s attention call at ``points``; with ``own_kv``, K/V fire from their projections."""
        names = {name: getattr(points, name) for name in SELF_HOOKS}
        if own_kv:  # the attention function sees cached K/V too: those must not fire hook_k/hook_v
            self._tap_kv(layer, attn, points, names)
        tap = attention.LayerTap(layer, names, self._base, False, d_head)  # its own stack's head width
        attention.TAPS[attn] = tap
        self._taps.append(tap)
        self._handles.append(attn.register_forward_pre_hook(self._enter(tap)))
        self._handles.append(attn.register_forward_hook(self._leave, always_call=True))
        out = _out_projection(attn, self._parents.get(id(attn)))
        if out is not None:
            self._handles.append(out.register_forward_hook(self._out_hook(out_point)))

    def _tap_kv(self, layer: int, attn: nn.Module, points: nn.Module, names: dict[str, HookPoint]) -> None:
        """Cross-attention's hook_k/hook_v from the K/V projections, so they fire only when K/V are computed.

        Separate projections (k_proj/v_proj, key/value, k/v) are hooked one each; GPT-2's fused ``c_attn`` is split
        at ``split_size`` as its forward splits it. Where neither is found the two hook points are removed, not the
        model refused: firing them from the attention function instead would fire them on K/V read back from the
        cache too, a false ``cross_kv_cache`` failure; without them only the rows needing them are unobservable
        (``no hook point ...``) and ``self.unhooked`` says why.
        """
        projs = [_child(attn, KEY_NAMES), _child(attn, VALUE_NAMES)]
        fused = _fused_kv(attn)
        if all(p is not None for p in projs):
            for name, proj in zip(("hook_k", "hook_v"), projs, strict=True):
                self._handles.append(cast(nn.Module, proj).register_forward_hook(self._heads_hook(names[name])))
        elif fused is not None:
            proj, split = fused
            self._handles.append(proj.register_forward_hook(self._fused_kv_hook(names["hook_k"], names["hook_v"],
                                                                                split)))
        else:
            why = (f"{type(attn).__name__} has no {'/'.join(KEY_NAMES)} and {'/'.join(VALUE_NAMES)} projections nor a "
                   f"fused {'/'.join(FUSED_KV_NAMES)} of width 2 * split_size: the hook fires only where K/V are "
                   f"computed, and the attention function also sees K/V read back from the cache")
            for name in ("hook_k", "hook_v"):
                delattr(points, name)
                self.unhooked[cross_attn_hook(layer, name)] = why
        for name in ("hook_k", "hook_v"):
            names[name] = HookPoint()  # idle: the attention function skips it

    def _enter_part(self, part: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self._part = part
        return hook

    def _leave_part(self, module: nn.Module, args: Any, output: Any) -> None:
        self._part = DECODER

    def _by_part(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            stack = self.encoder if self._part == ENCODER else self
            return self._out_hook(getattr(stack, name))(module, args, output)
        return hook

    def _fused_kv_hook(self, k_point: HookPoint, v_point: HookPoint, split: int) -> Any:
        """GPT-2's fused K/V output [batch, src_pos, 2 * split]: K is its first ``split`` features, V the rest (its
        forward's ``split(self.split_size, dim=2)``), each fired as :meth:`_heads_hook` fires a projection's."""
        hooks = (self._heads_hook(k_point), self._heads_hook(v_point))

        def hook(module: nn.Module, args: Any, output: Tensor) -> Any:
            halves = output.split(split, dim=-1)
            edited = [h(module, args, half) for h, half in zip(hooks, halves, strict=True)]
            if all(e is None for e in edited):
                return None
            return torch.cat([half if e is None else e for e, half in zip(edited, halves, strict=True)], dim=-1)
        return hook

    def _heads_hook(self, point: HookPoint) -> Any:
        """A K/V projection's output as [batch, src_pos, n_heads, d_head]: grouped K/V heads (T5Gemma's 2 for 4 query
        heads) repeated to every query head, as HFAdapter's hook_k; an edit must be the same across a group."""
        n_heads, d_head = self._cfg.n_heads, self._cfg.d_head

        def hook(module: nn.Module, args: Any, output: Tensor) -> Any:
            if not active(point):
                return None
            kv = output.unflatten(-1, (-1, d_head))  # [batch, src_pos, n_kv_heads, d_head]
            n_rep = n_heads // kv.shape[-2]
            y = point(kv.repeat_interleave(n_rep, dim=-2))
            if n_rep > 1:
                groups = y.unflatten(-2, (-1, n_rep))
                if not torch.equal(groups, groups[..., :1, :].expand_as(groups)):
                    raise AttnlabError(f"an edit of {point.name} differs between query heads that share a key/value "
                                       "head (grouped-query attention): expected one edit per group")
                y = groups[..., 0, :]
            return y.flatten(-2)
        return hook

    def _position_hook(self, part: str) -> Any:
        """The position table's output for the protocol's ids: the module's own forward, one row at a time."""
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> Any:
            ids = self._ids[part]
            if ids is not None:
                rows = [_table_at(module, args, kwargs, row) for row in ids]
                # a table that expands its rows to the batch (PEGASUS-X) gives one row's ids to every row: take one
                output = torch.stack([(r[0] if r.ndim == 3 else r).reshape(r.shape[-2], r.shape[-1]) for r in rows])
            stack = self.encoder if part == ENCODER else self
            point = getattr(stack, "hook_pos_embed", None)
            if point is None or not active(point):
                return output if ids is not None else None
            # Marian's table returns [pos, d_model] for the model to broadcast, BERT's and GPT-2's [1, pos, d_model]
            # (one ids row for the batch): the hook sees [batch, pos, d_model]
            return point(output if output.ndim == 3 and output.shape[0] == self._batch else
                         output.expand(self._batch, *output.shape[-2:]))
        return hook

    # ---- positions ------------------------------------------------------------------------------------
    def _impose(self, part: str, mask: Tensor, offset: int, new: int) -> None:
        """Set the positions of ``part``'s last ``new`` tokens where the protocol's differ from the model's."""
        if self._cfg.positional_embedding_type not in ADDED_POSITIONS or self._tables[part] is None:
            return
        ids = mask_positions(mask, offset, mask.shape[-1], mask.device)[:, -new:]
        if self._cfg.positional_embedding_type == "standard":
            check_table_positions(ids, self._cfg.n_ctx, f" (the {part}'s)")
        own = torch.arange(mask.shape[-1] - new, mask.shape[-1], device=mask.device)
        real = mask[:, -new:].bool()
        # a table from padding_idx + 1 (RoBERTa) is numbered from the token ids, not by index: a real token whose id
        # is pad_token_id takes the padding row and moves every later position, so it is always given the ids
        if not self._first_rows[part] and bool((ids == own).where(real, True).all()):
            return  # the model numbers these tokens as the protocol does: leave its forward untouched
        table = cast(nn.Module, self._tables[part])
        if _ids_param(table) is None:
            raise UnsupportedInput(f"{self._cfg.arch}'s {part} position table takes no position_ids: it cannot be "
                                   f"given left padding or a position offset")
        self._ids[part] = ids + self._first_rows[part]  # a bare table's rows in the model's numbering

    def _source(self, batch: int, device: torch.device, source_tokens: Optional[Tensor],
                source_mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        if source_tokens is None:
            if source_mask is not None:
                raise AttnlabError("source_mask was given without source_tokens: expected both or neither")
            source_tokens = torch.full((batch, 1), DEFAULT_SOURCE_ID, dtype=torch.long, device=device)
        real = check_source(source_tokens, source_mask, batch, self._cfg.d_vocab)
        return source_tokens, torch.ones_like(source_tokens) if real is None else real.long()

    # ---- forward --------------------------------------------------------------------------------------
    # no partial runs (stop_at_layer/start_at_layer): the probes then run every mask from the tokens
    def forward(self, tokens: Tensor, attention_mask: Optional[Tensor] = None,  # type: ignore[override]
                position_offset: int = 0, *, source_tokens: Optional[Tensor] = None,
                source_mask: Optional[Tensor] = None) -> Float[Tensor, "batch pos d_vocab"]:
        tokens, real, offset = check_inputs(tokens, attention_mask, position_offset, self._cfg.d_vocab)
        source, src_mask = self._source(tokens.shape[0], tokens.device, source_tokens, source_mask)
        mask = torch.ones_like(tokens) if real is None else real.long()
        self._batch = tokens.shape[0]
        try:
            self._impose(ENCODER, src_mask, 0, src_mask.shape[1])
            self._impose(DECODER, mask, offset, mask.shape[1])
            if offset and self._tables[DECODER] is None and self._cfg.positional_embedding_type != "none":
                raise UnsupportedInput(f"position_offset={offset} cannot be given to {self._cfg.arch}")
            return self.hf_model(input_ids=source, attention_mask=src_mask, decoder_input_ids=tokens,
                                 decoder_attention_mask=mask, use_cache=False).logits
        finally:
            self._ids = {ENCODER: None, DECODER: None}

    def forward_with_cache(self, tokens: Tensor, attention_mask: Optional[Tensor] = None,
                           past: Optional[_Past] = None, *, source_tokens: Optional[Tensor] = None,
                           source_mask: Optional[Tensor] = None) -> tuple[Tensor, _Past]:
        """Cached decoding (``harness.adapters.protocol.CachedDecoding``) through the model's own
        ``EncoderDecoderCache``; the source goes with the first call, which encodes it once."""
        check_tokens(tokens, self._cfg.d_vocab)
        real = check_mask(attention_mask, *tokens.shape)
        new = torch.ones_like(tokens) if real is None else real.long()
        if past is not None and not isinstance(past, _Past):
            raise AttnlabTypeError(f"past must be None or what forward_with_cache returned, got {type(past).__name__}")
        kwargs: dict[str, Any] = {"use_cache": True}
        self._batch = tokens.shape[0]
        if past is None:
            source, src_mask = self._source(tokens.shape[0], tokens.device, source_tokens, source_mask)
            kwargs.update(cache=None)
            mask = new
        else:
            if source_tokens is not None or source_mask is not None:
                raise AttnlabError("source_tokens were given for a cache that already holds a source: expected them "
                                   "only at the first call")
            src_mask, mask = past.source_mask, torch.cat((past.mask, new), 1)
            kwargs.update(encoder_outputs=past.encoder_outputs, cache=past.cache)
        try:
            if past is None:
                # the source is encoded once, by the encoder alone, and handed to the decoder as generate() does
                # (GenerationMixin._prepare_encoder_decoder_kwargs_for_generation): the encoder's own output type
                # (NLLB-MoE reads its router_logits), and no use_cache reaches it (Switch's encoder raises on one)
                self._impose(ENCODER, src_mask, 0, src_mask.shape[1])
                kwargs["encoder_outputs"] = self.hf_model.get_encoder()(input_ids=source, attention_mask=src_mask,
                                                                        return_dict=True)
            self._impose(DECODER, mask, 0, tokens.shape[1])
            out = self.hf_model(attention_mask=src_mask, decoder_input_ids=tokens, decoder_attention_mask=mask,
                                **kwargs)
        finally:
            self._ids = {ENCODER: None, DECODER: None}
        cache = getattr(out, "cache", None) if hasattr(out, "cache") else getattr(out, "past_key_values", None)
        # the encoder's own output object, not a tuple: T5Gemma and NLLB-MoE read ``encoder_outputs.last_hidden_state``
        # (and NLLB-MoE ``.router_logits``) and raised AttributeError on a tuple (census: t5gemma, nllb-moe)
        encoded = past.encoder_outputs if past is not None else kwargs["encoder_outputs"]
        return out.logits, _Past(cache, encoded, src_mask, mask)


__all__ = ["HFSeq2SeqAdapter", "Seq2SeqAdapterConfig", "is_hf_encoder_decoder"]
