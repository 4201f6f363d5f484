"""Witnesses for the census's findings (reports/census/findings.py FINDINGS), each independent of the property suite.

Each rebuilds the census's own tiny model (``reports.census.shrink.build``) and shows the bug on the
raw Hugging Face model; it raises AssertionError once the bug no longer reproduces.
"""

from __future__ import annotations

import inspect

import torch
import transformers

from reports.census.enumerate import by_name
from reports.census.shrink import build
from reports.census.variants import build_config
from tests.helpers.zoo_witness import falcon_output_attentions_leaks_future


def _tiny(model_type: str):
    mt = by_name()[model_type]
    return build(mt.name, mt.class_name)


def falcon_census(model_type: str = "falcon") -> str:
    """Falcon's eager branch under output_attentions=True adds sdpa's boolean mask to the scores (the zoo's finding)."""
    return falcon_output_attentions_leaks_future(_tiny(model_type))


def _real_logits(model, tokens, mask, **kw):
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask), **kw).logits


def left_padding_moves_positions(model_type: str) -> str:
    """The model's forward takes no ``position_ids`` and numbers its learned positions by index, so a left pad
    moves every real token one position on: the same real tokens give other logits, though the mask hides the pad.

    Witness: the raw model. ``[5, 7]`` against ``[pad, 5, 7]`` with the pad masked: the real tokens' logits
    differ; changing the pad's id changes nothing (the mask works; only the positions moved).
    """
    model = _tiny(model_type)
    assert "position_ids" not in inspect.signature(model.forward).parameters, model_type
    plain = _real_logits(model, [[5, 7]], [[1, 1]])
    padded = _real_logits(model, [[0, 5, 7]], [[0, 1, 1]])[:, 1:]
    other_pad = _real_logits(model, [[1, 5, 7]], [[0, 1, 1]])[:, 1:]
    moved, pad_seen = float((plain - padded).abs().max()), float((padded - other_pad).abs().max())
    assert moved > 1e-4 and pad_seen < 1e-6, (moved, pad_seen)
    return (f"{type(model).__name__}.forward takes no position_ids; one masked left pad moves the real tokens' "
            f"logits by {moved:.3g}; the pad's id moves them by {pad_seen:.3g}")


def padding_leaks_into_real_tokens(model_type: str) -> str:
    """A masked pad's token id reaches the real tokens (a convolution over neighbouring embeddings or an unmasked
    mixer): with the pad masked and positions given as the protocol counts them, its id still moves the logits.

    Witness: the raw model, ``[pad, 5, 7]`` with the pad masked, pad id 0 against 1.
    """
    model = _tiny(model_type)
    kw = {"position_ids": torch.tensor([[0, 0, 1]])} if "position_ids" in \
        inspect.signature(model.forward).parameters else {}
    a = _real_logits(model, [[0, 5, 7]], [[0, 1, 1]], **kw)[:, 1:]
    b = _real_logits(model, [[1, 5, 7]], [[0, 1, 1]], **kw)[:, 1:]
    leak = float((a - b).abs().max())
    assert leak > 1e-5, leak
    return f"{type(model).__name__}: the masked pad's id moves the real tokens' logits by {leak:.3g}"


def _float64(model_type: str):
    """The census model in float64 (MoE experts on transformers' eager loop: grouped_mm takes no float64), so a
    witnessed gap is the model's computation, not rounding."""
    model = _tiny(model_type)
    if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")
    return model.double().eval()


def logits_depend_on_length(model_type: str = "prophetnet") -> str:
    """ProphetNet's decoder gives position 0 other logits when the sequence is longer, whatever the later tokens
    are: what a token predicts depends on how many positions follow it, so cached decoding (which runs the
    shorter sequence first) cannot equal a full recompute.

    Witness: the raw model in float64: position 0's logits for ``[0]`` against ``[0, 0]`` (differ), and ``[0, 0]``
    against ``[0, 5]`` (equal: the later token's id reaches nothing); then cached decoding one token at a time
    against the full forward.
    """
    model = _float64(model_type)
    with torch.no_grad():
        first = lambda ids: model(torch.tensor([ids])).logits[0, 0]  # noqa: E731
        by_length = float((first([0]) - first([0, 0])).abs().max())
        by_token = float((first([0, 0]) - first([0, 5])).abs().max())
        tokens = torch.tensor([[0, 0, 5, 7]])
        full = model(tokens).logits
        out = model(tokens[:, :1], use_cache=True)
        steps = [out.logits[:, -1]]
        for i in range(1, tokens.shape[1]):
            out = model(tokens[:, i:i + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[:, -1])
    cached = float((torch.stack(steps, 1) - full).abs().max())
    assert by_length > 1e-6 and by_token < 1e-12 and cached > 1e-6, (by_length, by_token, cached)
    return (f"{type(model).__name__} (float64): position 0's logits move by {by_length:.3g} when one token is "
            f"appended, by {by_token:.3g} when that token's id changes; cached decoding is off the full forward by "
            f"{cached:.3g}")


def future_leaks_after_an_offset(model_type: str = "deepseek_v4") -> str:
    """DeepSeek-V4's compressor groups keys into windows by token index but lets query t see window w when
    ``(position_ids[t] + 1) // compress_rate > w``: with positions starting at 1, a query sees a window holding a
    later token (modeling_deepseek_v4: ``causal_threshold = (position_ids + 1) // self.compress_rate``).

    Witness: the raw model in float64, position_ids 1..4: positions 0..2's logits move when token 3 changes;
    with position_ids 0..3 they do not.
    """
    model = _float64(model_type)
    a, b = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[5, 6, 7, 9]])
    moved = {}
    with torch.no_grad():
        for offset in (0, 1):
            ids = torch.arange(4)[None] + offset
            la, lb = model(a, position_ids=ids).logits, model(b, position_ids=ids).logits
            moved[offset] = float((la[:, :3] - lb[:, :3]).abs().max())
    assert moved[0] < 1e-12 and moved[1] > 1e-6, moved
    return (f"{type(model).__name__} (float64): with positions 1..4 the logits of positions 0..2 move by "
            f"{moved[1]:.3g} when token 3 changes (with positions 0..3: {moved[0]:.3g})")


def left_pad_shifts_compressed_windows(model_type: str = "deepseek_v4") -> str:
    """DeepSeek-V4's compressed windows count token indices, its threshold counts position ids: one masked left
    pad (position ids from the mask, as generate() makes them) moves the real tokens' windows.

    Witness: the raw model in float64. ``[5, 6, 7]`` then 8 decoded through the cache equals the full forward of
    ``[5, 6, 7, 8]``; ``[pad, 5, 6, 7]`` (pad masked) gives other last logits, with the cache and without it.
    """
    model = _float64(model_type)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def last(tokens, mask, cached):
        tokens, mask = torch.tensor(tokens), torch.tensor(mask)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            if not cached:
                return model(tokens, attention_mask=mask, position_ids=pos).logits[:, -1]
            out = model(tokens[:, :-1], attention_mask=mask[:, :-1], position_ids=pos[:, :-1], use_cache=True)
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            return model(tokens[:, -1:], attention_mask=mask, position_ids=pos[:, -1:], use_cache=True,
                         **{name: cache}).logits[:, -1]

    full = last([[5, 6, 7, 8]], [[1, 1, 1, 1]], cached=False)
    exact = float((last([[5, 6, 7, 8]], [[1, 1, 1, 1]], cached=True) - full).abs().max())
    padded = {c: float((last([[0, 5, 6, 7, 8]], [[0, 1, 1, 1, 1]], cached=c) - full).abs().max()) for c in (0, 1)}
    assert exact < 1e-6 and min(padded.values()) > 1e-4, (exact, padded)
    return (f"{type(model).__name__} (float64): unpadded cached decoding is off the full forward by {exact:.3g}; "
            f"one masked left pad moves the last logits by {padded[1]:.3g} cached, {padded[0]:.3g} uncached")


def chunked_prefill_drops_state(model_type: str = "recurrent_gemma") -> str:
    """RecurrentGemma's recurrent block takes any call of more than one token for a fresh prefill: the conv and
    RG-LRU state the cache held are dropped (modeling_recurrent_gemma: ``if position_ids.shape[1] != 1:  #
    prefill``), so a cached call of several new tokens gives other logits than a full forward; one token at a
    time is exact.

    Witness: the raw model in float64 with a DynamicCache, as generate() passes it: prefill 2 then chunks of 1
    (exact), and prefill 2 then a chunk of 3 (off).
    """
    from transformers.cache_utils import DynamicCache

    model = _float64(model_type)
    tokens = torch.tensor([[2, 1, 5, 7, 9, 3]])
    gaps = {}
    with torch.no_grad():
        model(tokens[:, :2])  # no cache: its recurrent states set up afresh (RecurrentGemmaModel._setup_cache)
        full = model(tokens, use_cache=False).logits
        for split in ((2, 1, 1, 1, 1), (2, 1, 3)):
            model.model._setup_cache(model.config, 1, tokens.device, torch.float64)
            cache, outs, i = DynamicCache(config=model.config), [], 0
            for n in split:
                ids = torch.arange(i, i + n)[None]
                outs.append(model(tokens[:, i:i + n], position_ids=ids, use_cache=True, cache=cache).logits)
                i += n
            gaps[split] = float((torch.cat(outs, 1) - full).abs().max())
    assert gaps[(2, 1, 1, 1, 1)] < 1e-9 and gaps[(2, 1, 3)] > 1e-6, gaps
    return (f"{type(model).__name__} (float64): cached chunks of one token equal the full forward to "
            f"{gaps[(2, 1, 1, 1, 1)]:.3g}; a chunk of three after the prompt is off by {gaps[(2, 1, 3)]:.3g}")


def cached_chunk_differs(model_type: str = "jamba") -> str:
    """Jamba's cached decoding of a chunk of several new tokens gives other logits than a full forward (its Mamba
    mixer's multi-token path under a cache), while one token at a time is exact: not rounding, it holds in float64.

    Witness: the raw model in float64 through its own returned cache: prompt 1 then chunks (1, 1), and prompt 1
    then one chunk of 2, each against the full forward.
    """
    model = _float64(model_type)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    tokens = torch.tensor([[1, 0, 1]])
    gaps = {}
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
        for split in ((1, 1, 1), (1, 2)):
            cache, outs, i = None, [], 0
            for n in split:
                out = model(tokens[:, i:i + n], use_cache=True, **({} if cache is None else {name: cache}))
                cache = getattr(out, "cache", None) if hasattr(out, "cache") else out.past_key_values
                outs.append(out.logits)
                i += n
            gaps[split] = float((torch.cat(outs, 1) - full).abs().max())
    assert gaps[(1, 1, 1)] < 1e-12 and gaps[(1, 2)] > 1e-7, gaps
    return (f"{type(model).__name__} (float64): cached decoding one token at a time equals the full forward to "
            f"{gaps[(1, 1, 1)]:.3g}; a chunk of two after the prompt is off by {gaps[(1, 2)]:.3g}")


def window_ignored(model_type: str) -> str:
    """The config declares ``sliding_window`` but the model masks with plain ``create_causal_mask`` (no window
    overlay, no ``sliding_window`` passed to the attention function): every query sees every earlier key.

    Witness: the raw model under eager attention, ``output_attentions=True``, on w + 2 tokens: the last query's
    weight on key 0, at distance w + 1, is positive, though a window of w admits no key that far back
    (under transformers' convention ``i - w < j``, nor under the looser ``i - j <= w``).
    """
    model = _tiny(model_type)
    model.set_attn_implementation("eager")
    w = int(model.config.sliding_window)
    tokens = torch.arange(w + 2)[None] % model.config.vocab_size
    with torch.no_grad():
        out = model(input_ids=tokens, attention_mask=torch.ones_like(tokens), output_attentions=True)
    seen = min(float(a[0, :, w + 1, 0].min()) for a in out.attentions)
    assert seen > 1e-3, seen
    return (f"{type(model).__name__}: config.sliding_window={w}, yet query {w + 1} puts weight >= {seen:.3g} "
            f"on key 0 (distance {w + 1}) in every layer and head")


# The bridge census's findings (reports/census/findings.py BRIDGE_FINDINGS): the census's tiny model inside
# TransformerLens's bridge, built here with TransformerLens's own API (not BridgeAdapter), against a second copy
# of the raw model (the same seed gives the same weights) or TransformerLens's own definitions.

FIRST, SECOND = torch.tensor([[3, 5]]), torch.tensor([[3, 9]])  # differ only at position 1


def _bridged(model_type: str):
    """(raw tiny model, bridge around an identical copy): the builder replaces modules of the model it wraps."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    raw, copy = _tiny(model_type), _tiny(model_type)
    bridge = build_bridge_from_module(copy, type(copy).__name__, hf_config=copy.config)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return raw, bridge


def bridge_not_causal(model_type: str) -> str:
    """Given an ``attention_mask`` (even all ones, as any batched caller passes), the bridge attends without its
    causal mask: position 0's logits move when token 1 changes and differ from the raw model's. Without the mask
    argument the bridge is causal; the raw model is causal either way.

    Witness: the raw HF model (same seed, same weights) and the bridge's own forward on ``[3, 5]`` / ``[3, 9]``
    with ``attention_mask=[[1, 1]]``.
    """
    raw, bridge = _bridged(model_type)
    ones = torch.ones_like(FIRST)
    with torch.no_grad():
        raw_a = raw(input_ids=FIRST, attention_mask=ones).logits
        raw_b = raw(input_ids=SECOND, attention_mask=ones).logits
        br_a, br_b = bridge(FIRST, attention_mask=ones), bridge(SECOND, attention_mask=ones)
        unmasked = float((bridge(SECOND) - bridge(FIRST))[0, 0].abs().max())
    raw_moves, br_moves = float((raw_b - raw_a)[0, 0].abs().max()), float((br_b - br_a)[0, 0].abs().max())
    differs = float((br_a - raw_a).abs().max())
    assert raw_moves == 0.0 and br_moves > 1e-6 and differs > 1e-6, (raw_moves, br_moves, differs)
    return (f"with attention_mask=[[1, 1]], the bridge's position 0 logits move by {br_moves:.3g} when token 1 "
            f"changes (raw model: 0; the bridge without the mask argument: {unmasked:.3g}); the bridge's logits "
            f"differ from the raw model's by {differs:.3g}")


def bridge_attn_scores_is_pattern(model_type: str) -> str:
    """The bridge fires ``hook_attn_scores`` with the post-softmax pattern: TransformerLens defines
    ``hook_pattern = softmax(hook_attn_scores)``, yet here the two are equal and softmax(scores) is not the pattern;
    the bridge's logits equal the raw model's (the function is right, the hook is not).
    """
    raw, bridge = _bridged(model_type)
    x = torch.tensor([[3, 5, 7]])
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(x)
        same_logits = float((logits - raw(input_ids=x).logits).abs().max())
    scores, pattern = cache["blocks.0.attn.hook_attn_scores"], cache["blocks.0.attn.hook_pattern"]
    off = float((scores.softmax(-1) - pattern).abs().max())
    assert torch.equal(scores, pattern) and off > 1e-3 and same_logits < 1e-4, (off, same_logits)
    return (f"blocks.0.attn.hook_attn_scores equals hook_pattern exactly; softmax(scores) is off the pattern by "
            f"{off:.3g}; the bridge's logits match the raw model's to {same_logits:.3g}")


def _attention_reads(model_type: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float]:
    """The bridge's cache on ``[3, 5, 7]``, the raw model's o_proj inputs and v_norm outputs per layer index (forward
    hooks on the raw model's own modules), and how far the bridge's logits are from the raw model's."""
    raw, bridge = _bridged(model_type)
    x = torch.tensor([[3, 5, 7]])
    reads: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in raw.named_modules():
        layer = next((part for part in name.split(".") if part.isdigit()), None)
        if name.endswith("self_attn.o_proj"):
            handles.append(module.register_forward_pre_hook(
                lambda m, args, key=f"o_in.{layer}": reads.__setitem__(key, args[0])))
        elif name.endswith("self_attn.v_norm"):
            handles.append(module.register_forward_hook(
                lambda m, args, out, key=f"v_norm.{layer}": reads.__setitem__(key, out)))
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(x)
        gap = float((logits - raw(input_ids=x).logits).abs().max())
    for handle in handles:
        handle.remove()
    return dict(cache.items()), reads, gap


def _per_head(v: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[batch, pos, kv_heads, d] repeated to the query heads (grouped-query attention), as the kernel shares them."""
    return v.repeat_interleave(n_heads // v.shape[2], dim=2)


def _pattern_v(cache: dict[str, torch.Tensor], layer: int, v: torch.Tensor) -> torch.Tensor:
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
    return torch.einsum("bhqk,bkhd->bqhd", pattern, _per_head(v, pattern.shape[1]))


def bridge_z_is_o_proj_input(model_type: str) -> str:
    """The bridge fires ``hook_z`` with the input of ``o_proj``, which on this architecture comes after a step
    between the attention kernel and the output projection (AFMoE's sigmoid gate, BitNet's ``attn_sub_norm`` over
    all heads): TransformerLens defines z as the pattern-weighted sum of the values, and here it is not.

    Witness: in every layer the bridge's ``hook_z`` equals the raw model's ``o_proj`` input (a forward pre-hook on
    the raw model's own module) and is off ``hook_pattern . hook_v`` (grouped heads repeated); the bridge's logits
    equal the raw model's (the function is right, the hook is not where TransformerLens defines it).
    """
    cache, reads, gap = _attention_reads(model_type)
    layers = sorted(int(k.split(".")[1]) for k in reads if k.startswith("o_in."))
    z = {i: cache[f"blocks.{i}.attn.hook_z"] for i in layers}
    at_o = max(float((z[i].flatten(2) - reads[f"o_in.{i}"]).abs().max()) for i in layers)
    off = max(float((_pattern_v(cache, i, cache[f"blocks.{i}.attn.hook_v"]) - z[i]).abs().max()) for i in layers)
    assert layers and at_o < 1e-4 and off > 1e-2 and gap < 1e-4, (layers, at_o, off, gap)
    return (f"hook_z equals o_proj's input to {at_o:.3g} in layers {layers}, and is off hook_pattern . hook_v by up "
            f"to {off:.3g}; the bridge's logits match the raw model's to {gap:.3g}")


def bridge_v_before_v_norm(model_type: str) -> str:
    """The bridge fires ``hook_v`` with ``v_proj``'s output, before Gemma 4's ``v_norm``; the attention reads the
    normalized values, so ``hook_pattern . hook_v`` is not ``hook_z`` (TransformerLens's z = pattern . v).

    Witness: in every layer the bridge's ``hook_z`` equals ``hook_pattern`` times the raw model's ``v_norm`` output
    (a forward hook on the raw model's own module), is off ``hook_pattern . hook_v``, and ``hook_v`` differs from
    the ``v_norm`` output; the bridge's logits equal the raw model's.
    """
    cache, reads, gap = _attention_reads(model_type)
    layers = sorted(int(k.split(".")[1]) for k in reads if k.startswith("v_norm."))
    normed = {i: reads[f"v_norm.{i}"] for i in layers}
    normed = {i: v if v.shape[1] == cache[f"blocks.{i}.attn.hook_v"].shape[1] else v.transpose(1, 2)
              for i, v in normed.items()}  # [batch, heads, pos, d] where the module keeps heads first
    z = {i: cache[f"blocks.{i}.attn.hook_z"] for i in layers}
    with_norm = max(float((_pattern_v(cache, i, normed[i]) - z[i]).abs().max()) for i in layers)
    off = max(float((_pattern_v(cache, i, cache[f"blocks.{i}.attn.hook_v"]) - z[i]).abs().max()) for i in layers)
    assert layers and with_norm < 1e-4 and off > 1e-2 and gap < 1e-4, (layers, with_norm, off, gap)
    return (f"hook_z equals hook_pattern . v_norm(v) to {with_norm:.3g} in layers {layers}, and is off "
            f"hook_pattern . hook_v by up to {off:.3g}; the bridge's logits match the raw model's to {gap:.3g}")


def rotary_dim_ignored(model_type: str = "minimax_m3_vl_text") -> str:
    """The config's ``rotary_dim`` (channels RoPE turns, the rest passed through) changes nothing: the float64 logits
    with rotary_dim = head_dim / 2 and = head_dim are equal, while partial_rotary_factor = 0.5 in rope_parameters, the
    field the rotary embedding reads, moves them (so the witness can see a change of the rotated span)."""
    mt = by_name()[model_type]

    def logits(changes: dict) -> torch.Tensor:
        config = build_config(mt.name, mt.class_name, changes)
        torch.manual_seed(0)
        model = getattr(transformers, mt.class_name)._from_config(config, dtype=torch.float64)
        if hasattr(model, "set_experts_implementation"):  # grouped_mm has no float64 kernel
            model.set_experts_implementation("eager")
        with torch.no_grad():
            return model.eval()(input_ids=torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])).logits

    base = build_config(mt.name, mt.class_name, {})
    d = base.head_dim
    half, whole = logits({"rotary_dim": d // 2}), logits({"rotary_dim": d})
    partial = logits({"rope_parameters": {**base.rope_parameters, "partial_rotary_factor": 0.5}})
    ignored, honoured = float((half - whole).abs().max()), float((half - partial).abs().max())
    assert ignored == 0.0 and honoured > 1e-6, (ignored, honoured)  # float64: rounding alone is ~1e-16
    return (f"{model_type}, float64: logits with rotary_dim={d // 2} and rotary_dim={d} differ by {ignored:.3g}; "
            f"partial_rotary_factor=0.5 moves them by {honoured:.3g}")


# witness name -> function of the model type (reports/census/findings.py names them)
WITNESSES = {f.__name__: f for f in (falcon_census, left_padding_moves_positions, padding_leaks_into_real_tokens,
                                     window_ignored, bridge_not_causal, bridge_attn_scores_is_pattern,
                                     bridge_z_is_o_proj_input, bridge_v_before_v_norm, logits_depend_on_length,
                                     future_leaks_after_an_offset, left_pad_shifts_compressed_windows,
                                     chunked_prefill_drops_state, cached_chunk_differs, rotary_dim_ignored)}
