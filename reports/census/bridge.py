"""The census through TransformerLens's bridge (``attnlab census --bridge``): a conformance mode.

Each model type's tiny model is the raw census's (the same shrink, the same seed, the same plain
input), wrapped by ``TransformerBridge`` (``build_bridge_from_module``, compatibility mode, no weight
processing) behind :class:`~harness.adapters.bridge.BridgeAdapter` instead of ``HFAdapter``, and
checked by the same suite. The categories are the raw census's (:data:`CATEGORIES`) plus two of the
bridge's own:

- ``bridge fails``: the raw model runs the plain input, the bridge built around it raises on it;
- ``unsupported by the bridge``: TransformerLens has no architecture adapter for the model's class (the
  class is named, and the heads of the same model type it does have), or its builder raises on the
  tiny model (the exception).

A failed row is a ``finding`` only with a witness: a bridge finding
(:data:`reports.census.findings.BRIDGE_FINDINGS`, shown against the raw model without the suite) or
the raw model's own documented finding, which the bridge inherits; otherwise ``untriaged``.
"""

from __future__ import annotations

import importlib.metadata
from functools import cache
from typing import Any, Optional

import torch

from harness.adapters import BridgeAdapter
from harness.adapters.hf_design import design_of
from reports.census import classify as census
from reports.census import findings
from reports.census.classify import PLAIN, Result
from reports.census.enumerate import MAPPINGS, ModelType

CATEGORIES = (*census.CATEGORIES[:-2], "transformers fails", "bridge fails", "unsupported by the bridge",
              "unsupported")
ROUTE = "bridge"
# the protocol's hook kinds (docs/architecture.md): the bridge also fires hook_in/hook_out on every component
PROTOCOL_HOOKS = frozenset({
    "hook_embed", "hook_pos_embed", "hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out",
    "hook_mlp_out", "mlp.hook_pre", "mlp.hook_post", "ln_final.hook_scale", "ln_final.hook_normalized",
    *(f"{ln}.{h}" for ln in ("ln1", "ln2") for h in ("hook_scale", "hook_normalized")),
    *(f"attn.{h}" for h in ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_attn_scores",
                            "hook_pattern", "hook_z", "hook_result"))})


def version() -> str:
    return importlib.metadata.version("transformer-lens")


@cache
def architectures() -> frozenset[str]:
    """The Hugging Face class names TransformerLens's bridge has an architecture adapter for."""
    # ~2 s to import: paid by the bridge census only, not by every `attnlab` command
    from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory

    return frozenset(ArchitectureAdapterFactory._adapters)


def other_heads(mt: ModelType) -> list[str]:
    """The heads of ``mt`` in the census's auto mappings, other than the one the census builds, that the bridge has."""
    heads = {(c[0] if isinstance(c, (list, tuple)) else c) for m in MAPPINGS.values() for n, c in m.items()
             if n == mt.name}
    return sorted(h for h in heads - {mt.class_name} if h in architectures())


def missing(mt: ModelType) -> Optional[str]:
    """Why the bridge cannot take ``mt``'s census model, when it has no architecture adapter for its class."""
    if mt.class_name in architectures():
        return None
    others = other_heads(mt)
    also = f" (it has {', '.join(others)} for {mt.name}, a head the census does not build)" if others else ""
    return f"TransformerLens {version()} has no architecture adapter for {mt.class_name}{also}"


def classify(mt: ModelType, result: Optional[Result] = None) -> Result:
    """The bridge census result of ``mt``; never raises for anything the model, the bridge or the adapter does."""
    return census.classify(mt, result, stages=_classify)


def _classify(mt: ModelType, r: Result) -> None:
    prepared = census.prepare(mt, r)
    if prepared is None:
        if r.category == "no attention":
            r.reason += f"; the bridge: {missing(mt) or 'has an architecture adapter for ' + mt.class_name}"
        return
    model, seq2seq, hybrid = prepared
    text_config = census.multimodal(model)
    r.stage, r.route = "bridge", ROUTE
    why = missing(mt)
    if why is not None:
        r.category, r.reason = "unsupported by the bridge", why
        return
    try:  # read before the builder replaces the model's modules (as BridgeAdapter.from_hf does)
        design = design_of(model)
    except Exception:  # a model the reader cannot take still gets the bridge's own cfg
        design = None
    try:
        bridge = build_bridge(model)
    except Exception as exc:
        r.category, r.reason = "unsupported by the bridge", f"the bridge's builder for {mt.class_name} raised " \
            f"{census.exc_line(exc)}"
        return
    r.stage = "bridge forward"
    try:
        with torch.no_grad():
            bridge(PLAIN, **census.plain_kwargs(mt))
    except Exception as exc:
        r.category = "bridge fails"
        r.reason = f"the bridge on a plain input ({PLAIN.tolist()}) raises {census.exc_line(exc)} " \
            "(the raw model runs it)"
        return
    if seq2seq:
        r.category = "unsupported"
        r.reason = "BridgeAdapter has no encoder-decoder route (HFSeq2SeqAdapter's source_tokens/source_mask); " \
            "the bridge itself runs the plain input"
        return
    r.stage = "adapter"
    try:
        adapter = BridgeAdapter(bridge, design)
    except Exception as exc:
        r.category, r.reason = "unsupported", f"BridgeAdapter: {census.exc_line(exc)}"
        return
    census.check(adapter, r, "BridgeAdapter", text_config, hybrid, documented(mt.name))
    r.hooks = [h for h in r.hooks if h in PROTOCOL_HOOKS]


def build_bridge(model: torch.nn.Module) -> Any:  # a TransformerBridge
    """``model`` (replaced in place) inside a compatibility-mode bridge that keeps its weights as given."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    bridge = build_bridge_from_module(model, type(model).__name__, hf_config=model.config)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return bridge


def documented(model_type: str) -> dict[str, str]:
    """Property -> summary of the witnessed findings a bridge failure of ``model_type`` may be: the bridge's own,
    and the raw model's (the bridge runs the same modeling code, so it inherits them)."""
    raw = {p: f"the raw model's finding, inherited: {f.summary}" for p, f in findings.for_type(model_type).items()}
    return raw | {p: f.summary for p, f in findings.bridge_for_type(model_type).items()}
