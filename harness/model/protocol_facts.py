"""The model protocol's vocabulary (docs/architecture.md), defined once for the model and the adapters.

``ModelConfig`` accepts these values and ``harness.adapters.protocol.check_protocol`` requires them of
any model's ``cfg``; both import them from here, so the two cannot drift apart.
"""

from __future__ import annotations

# The fields every protocol model's cfg has.
CFG_FIELDS = ("n_layers", "n_heads", "d_head", "d_model", "d_vocab", "n_ctx",
              "positional_embedding_type", "attention_dir")
# "standard" is a learned absolute table (Vaswani et al. 2017 §3.5 also try it); "sinusoidal" the
# paper's fixed table; "rotary" RoPE (Su et al. 2021); "alibi" linear biases (Press et al. 2022).
POSITIONAL_TYPES = ("standard", "sinusoidal", "rotary", "alibi", "none")
# The positional types that add a table to the residual stream (and so fire hook_pos_embed).
ADDED_POSITIONS = ("standard", "sinusoidal")
ATTENTION_DIRS = ("causal", "bidirectional")

# --- the encoder-decoder part of the protocol (docs/architecture.md, "Encoder-decoders") ---------------
# A model declares itself an encoder-decoder with cfg.is_encoder_decoder = True (Hugging Face's name) and
# cfg.n_encoder_layers; its forward then also takes the source by these keywords. ``tokens`` stays the
# decoder's input, so every decoder-only property reads the decoder.
IS_ENCODER_DECODER = "is_encoder_decoder"
SOURCE_INPUTS = ("source_tokens", "source_mask")
# Hook names: the encoder's are a decoder-only model's under this prefix; cross-attention's sit in each
# decoder block under CROSS_ATTN, with the residual after it at hook_resid_mid2.
ENCODER_PREFIX = "encoder."
CROSS_ATTN = "cross_attn"
CROSS_BLOCK_HOOKS = ("hook_cross_attn_out", "hook_resid_mid2")
CROSS_ATTN_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")


def encoder_hook(layer: int | str, name: str) -> str:
    """``encoder.blocks.{layer}.{name}``, e.g. ``encoder_hook(0, "attn.hook_pattern")``."""
    return f"{ENCODER_PREFIX}blocks.{layer}.{name}"


def cross_attn_hook(layer: int | str, name: str) -> str:
    """``blocks.{layer}.cross_attn.{name}``, e.g. ``cross_attn_hook(1, "hook_pattern")``."""
    return f"blocks.{layer}.{CROSS_ATTN}.{name}"
