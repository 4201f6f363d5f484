"""Adapter that makes a TransformerLens ``TransformerBridge`` follow the model protocol.

The bridge wraps a Hugging Face model and, in compatibility mode, exposes TransformerLens
hook names (``blocks.0.attn.hook_pattern`` ...), but its ``forward`` takes Hugging Face
arguments and its ``cfg`` is a ``TransformerBridgeConfig``. :class:`BridgeAdapter` is a
``HookedRootModule`` whose hook names are the bridge's own hook points (the same objects,
so a hook attached through the adapter fires inside the bridge), whose ``cfg`` carries the
protocol fields, and whose ``forward`` turns the protocol's ``position_offset`` and padding
rule into Hugging Face ``position_ids``.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional

import torch
from torch import Tensor, nn
from transformer_lens import HookedRootModule

from harness.adapters.design_facts import AdapterConfig, design_facts
from harness.adapters.hf_design import design_of
from harness.adapters.protocol import model_device
from harness.errors import AttnlabTypeError
from harness.model.inputs import check_inputs, check_table_positions
from harness.model.positions import mask_positions
from harness.model.protocol_facts import ATTENTION_DIRS, POSITIONAL_TYPES


def is_bridge(obj: Any) -> bool:
    """Whether ``obj`` is a TransformerLens ``TransformerBridge`` (a hooked module around a Hugging Face model).

    By type, not by attributes: an adapter around a Hugging Face model may carry ``original_model``
    and ``hook_dict`` too. The one bridge test: :func:`harness.adapters.entry.adapt`, the adapter and
    the probes all ask it.
    """
    # A bridge exists only once transformer_lens.model_bridge is loaded; importing it costs ~2 s, which every
    # entry point would pay for a model that is not one.
    module = sys.modules.get("transformer_lens.model_bridge")
    return module is not None and isinstance(obj, module.TransformerBridge)


# DesignFacts fields that hold one value per layer
PER_LAYER_FACTS = ("attn_scales", "sliding_window", "attention_sinks", "rotary_layers")


class BridgeAdapter(HookedRootModule):
    """A ``TransformerBridge`` (compatibility mode) behind the protocol's forward, cfg and hook names.

    ``forward(tokens, attention_mask=None, position_offset=0)`` passes the protocol's positions
    (:func:`harness.model.positions.mask_positions`) as ``position_ids``: a token's position is the
    offset plus the number of real tokens before it, so left padding does not move positions
    (Hugging Face models otherwise number positions by index).
    """

    def __init__(self, bridge: Any, design: Any = None):  # a TransformerBridge (checked below); dynamic attributes
        super().__init__()
        if not is_bridge(bridge):
            raise AttnlabTypeError(f"BridgeAdapter expects a transformer_lens TransformerBridge, got "
                                   f"{type(bridge).__name__}")
        if "blocks.0.attn.hook_pattern" not in bridge.hook_dict:
            # TransformerLens hook names live in compatibility mode; no_processing keeps the weights as given
            bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
        self.bridge = bridge
        self._cfg = self._read_cfg(bridge.cfg, design if design is not None else self._design_of(bridge),
                                   str(model_device(bridge)))
        self.setup()

    @staticmethod
    def _design_of(bridge: Any) -> Any:
        """The HFAdapter cfg of the model inside ``bridge`` where it can still be read, else None."""
        try:
            return design_of(bridge.original_model)
        except Exception:  # the builder replaced modules the reader needs: textbook defaults
            return None

    @staticmethod
    def _read_cfg(cfg: Any, design: Optional[AdapterConfig] = None, device: Optional[str] = None) -> AdapterConfig:
        pos = getattr(cfg, "positional_embedding_type", None)
        direction = getattr(cfg, "attention_dir", "causal")
        if pos not in POSITIONAL_TYPES:
            raise AttnlabTypeError(f"bridge cfg.positional_embedding_type={pos!r} is not one of "
                                   f"{list(POSITIONAL_TYPES)}")
        if direction not in ATTENTION_DIRS:
            raise AttnlabTypeError(f"bridge cfg.attention_dir={direction!r} is not one of {list(ATTENTION_DIRS)}")
        facts: dict[str, Any] = {}
        if design is not None:
            facts = design_facts(design)
            if design.n_layers != cfg.n_layers:
                # a hybrid stack: HFAdapter's blocks are its attention layers, the bridge's every layer. The model's
                # facts hold (RecurrentGemma's reset at position 0); the per-layer ones cannot be matched up
                facts.update({name: None for name in PER_LAYER_FACTS})
                uniform = design.attn_scales is None or len(set(design.attn_scales)) == 1
                facts.update(attn_scale=design.attn_scale if uniform else None)
                design = dataclasses.replace(design, attn_scales=None)
            if design.attn_scales is not None:
                # the bridge's hook_q is q as the projection gives it, before a pre-scale (OPT) the HF route's
                # hook_q already carries: the factor on it is the whole scale
                scales = tuple(s * (design.query_prescale or 1.0) for s in design.attn_scales)
                facts.update(attn_scale=scales[0], attn_scales=scales, query_prescale=None)
            facts["arch"] = design.arch
        return AdapterConfig(adapter="BridgeAdapter", n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_head=cfg.d_head,
                             d_model=cfg.d_model, d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx, positional_embedding_type=pos,
                             attention_dir=direction, normalization_type=getattr(cfg, "normalization_type", None),
                             n_key_value_heads=getattr(cfg, "n_key_value_heads", None), device=device, **facts)

    @classmethod
    def from_hf(cls, hf_model: nn.Module, architecture: Optional[str] = None) -> BridgeAdapter:
        """Wrap an in-memory Hugging Face causal LM (e.g. ``GPT2LMHeadModel``, ``LlamaForCausalLM``).

        The bridge replaces submodules of ``hf_model`` in place (TransformerLens's builder does),
        so pass a model you do not need unwrapped afterwards.
        """
        # transformer_lens.model_bridge costs ~2 s to import: loaded when a bridge is built, not by every entry point
        from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

        if not isinstance(hf_model, nn.Module) or not hasattr(hf_model, "config"):
            raise AttnlabTypeError(f"from_hf expects a Hugging Face PreTrainedModel, got {type(hf_model).__name__}")
        arch = architecture or (getattr(hf_model.config, "architectures", None) or [type(hf_model).__name__])[0]
        try:  # read before the builder replaces modules
            design = design_of(hf_model)
        except Exception:  # a model the reader cannot take still gets the bridge's own cfg
            design = None
        bridge = build_bridge_from_module(hf_model.eval(), arch, hf_config=hf_model.config)
        # no_processing: keep Hugging Face's weights as they are (no LayerNorm folding or unembedding
        # centering), so the adapter computes exactly the function the Hugging Face model computes.
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
        return cls(bridge, design)

    def setup(self) -> None:
        # The bridge's hook points keep their own names (HookedRootModule.setup would rename them
        # "bridge.blocks..."), so the adapter's dictionaries are the bridge's, aliases included.
        self.mod_dict = dict(self.bridge.mod_dict)
        self.hook_dict = dict(self.bridge.hook_dict)

    @property
    def cfg(self) -> AdapterConfig:
        return self._cfg

    def forward(self, tokens: Tensor, attention_mask: Optional[Tensor] = None, position_offset: int = 0) -> Tensor:
        cfg = self._cfg
        tokens, real, position_offset = check_inputs(tokens, attention_mask, position_offset, cfg.d_vocab)
        mask = torch.ones_like(tokens) if real is None else real.long()
        position_ids = mask_positions(mask, position_offset, mask.shape[-1], mask.device)
        if cfg.positional_embedding_type == "standard":
            check_table_positions(position_ids, cfg.n_ctx)
        return self.bridge(tokens, attention_mask=mask, position_ids=position_ids)
