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
