"""The references our model is timed against: code we would write without the harness.

- :class:`PlainGPT`: a plain minimal GPT (nanoGPT-style: fused QKV, ``scaled_dot_product_attention``,
  no hooks), the speed a Transformer of the same shapes has with nothing added;
- :func:`naive_head_ablation`: leave-one-out head ablation as one full forward pass per head;
- :func:`hf_gpt2_pair`: a Hugging Face GPT-2 wrapped by TransformerLens's ``TransformerBridge``,
  with our model holding the same weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
from transformers import GPT2Config, GPT2LMHeadModel

from harness._checks import check_positive_int
from harness.errors import AttnlabError
from harness.model.convert import from_hf


class PlainBlock(nn.Module):
    """Pre-norm block (Radford et al. 2019): x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class PlainGPT(nn.Module):
    """The same parameters as ``Transformer(ModelConfig(..., act_fn="gelu"))``, and nothing else."""

    def __init__(self, n_layers: int, d_model: int, n_heads: int, n_ctx: int, d_vocab: int):
        super().__init__()
        for name, value in (("n_layers", n_layers), ("d_model", d_model), ("n_heads", n_heads),
                            ("n_ctx", n_ctx), ("d_vocab", d_vocab)):
            check_positive_int(f"PlainGPT: {name}", value)
        if d_model % n_heads:
            raise AttnlabError(f"PlainGPT: d_model={d_model} is not a multiple of n_heads={n_heads}")
        self.wte, self.wpe = nn.Embedding(d_vocab, d_model), nn.Embedding(n_ctx, d_model)
        self.blocks = nn.ModuleList(PlainBlock(d_model, n_heads) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, d_vocab, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


@torch.no_grad()
def reference_loss(model: Any, tokens: Tensor, hooks: Any = (), *, loss_mask: Optional[Tensor] = None,
                   attention_mask: Optional[Tensor] = None) -> float:
    """Token-weighted next-token cross-entropy in float64 from one plain forward pass with ``hooks`` on.

    The target at position t (predicted at t-1) counts where ``loss_mask[:, t]`` is set and tokens
    t-1 and t are both real under ``attention_mask``: the weighting the probes use.
    """
    kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
    with model.hooks(fwd_hooks=list(hooks)):
        logits = model(tokens, **kwargs)
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1).double(), tokens[:, 1:].flatten(), reduction="none")
    w = torch.ones_like(tokens[:, 1:], dtype=torch.float64)
    if loss_mask is not None:
        w = w * loss_mask[:, 1:]
    if attention_mask is not None:
        w = w * attention_mask[:, 1:] * attention_mask[:, :-1]
    return float((nll * w.flatten()).sum() / w.sum())


@torch.no_grad()
def naive_head_ablation(model: Any, tokens: Tensor, *, replacement: Optional[Sequence[Tensor]] = None,
                        loss_mask: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None) -> Tensor:
    """Loss change ``[n_layers, n_heads]`` (float64) from removing each head at ``hook_z``, one forward per head.

    The obvious loop: a baseline forward pass, then for every head a full forward pass with a hook
    that replaces that head's output before the output projection: by zero, or (mean ablation) by
    ``replacement[layer][:, head]`` (``[pos, n_heads, d_head]`` per layer). No batching, no reuse.
    The loss is :func:`reference_loss` (so masks weigh targets as the probes do).
    """
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.shape[1] < 2:
        raise AttnlabError(f"tokens must be a [batch, pos] tensor with pos >= 2, got "
                           f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    masks = {"loss_mask": loss_mask, "attention_mask": attention_mask}
    base = reference_loss(model, tokens, **masks)
    delta = torch.empty(n_layers, n_heads, dtype=torch.float64)
    for layer in range(n_layers):
        for head in range(n_heads):
            def remove(z: Tensor, hook: Any, head: int = head, layer: int = layer) -> Tensor:
                z = z.clone()
                z[:, :, head] = 0 if replacement is None else replacement[layer][None, :, head]
                return z

            delta[layer, head] = reference_loss(model, tokens, [(f"blocks.{layer}.attn.hook_z", remove)],
                                                **masks) - base
    return delta


def hf_gpt2_pair(n_layers: int, d_model: int, n_heads: int, n_ctx: int, d_vocab: int,
                 seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """``(ours, bridge)``: a random Hugging Face GPT-2 in a ``TransformerBridge`` (compatibility mode)
    and our :class:`harness.Transformer` with the same weights (:func:`harness.model.convert.from_hf`).

    Built in memory from a config: nothing is downloaded. Dropout is 0, both are in eval mode.
    """
    config = GPT2Config(n_layer=n_layers, n_embd=d_model, n_head=n_heads, n_positions=n_ctx, vocab_size=d_vocab,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    with torch.random.fork_rng(devices=[]):  # HF initializes from the global generator: leave it as it was
        torch.manual_seed(seed)
        hf = GPT2LMHeadModel(config).eval()
    ours = from_hf(hf)  # before bridging: the bridge replaces hf's submodules in place
    bridge = build_bridge_from_module(hf, "GPT2LMHeadModel", hf_config=hf.config)
    bridge.enable_compatibility_mode()
    return ours.eval(), bridge.eval()
