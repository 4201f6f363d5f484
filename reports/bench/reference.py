"""The references our model is timed against: code we would write without the harness.

- :class:`PlainGPT`: a plain minimal GPT (nanoGPT-style: fused QKV, ``scaled_dot_product_attention``,
  no hooks), the speed a Transformer of the same shapes has with nothing added;
- :func:`naive_head_ablation`: leave-one-out head ablation as one full forward pass per head;
- :func:`hf_gpt2_pair`: a Hugging Face GPT-2 wrapped by TransformerLens's ``TransformerBridge``,
  with our model holding the same weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PlainGPT: {name}={value!r} is invalid: expected an integer >= 1")
        if d_model % n_heads:
            raise ValueError(f"PlainGPT: d_model={d_model} is not a multiple of n_heads={n_heads}")
        self.wte, self.wpe = nn.Embedding(d_vocab, d_model), nn.Embedding(n_ctx, d_model)
        self.blocks = nn.ModuleList(PlainBlock(d_model, n_heads) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, d_vocab, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def next_token_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """Mean cross-entropy of predicting ``tokens[:, 1:]`` from ``logits[:, :-1]``."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))


@torch.no_grad()
def naive_head_ablation(model: Any, tokens: Tensor) -> Tensor:
    """Loss change ``[n_layers, n_heads]`` (float64) from zeroing each head's ``hook_z``, one forward per head.

    The obvious loop: a baseline forward pass, then for every head a full forward pass with a hook
    that zeroes that head's output before the output projection. No batching, no reuse.
    """
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be a [batch, pos] tensor with pos >= 2, got "
                         f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    base = next_token_loss(model(tokens), tokens)
    delta = torch.empty(n_layers, n_heads, dtype=torch.float64)
    for layer in range(n_layers):
        for head in range(n_heads):
            def zero(z: Tensor, hook: Any, head: int = head) -> Tensor:
                z = z.clone()
                z[:, :, head] = 0
                return z

            with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)]):
                delta[layer, head] = float(next_token_loss(model(tokens), tokens) - base)
    return delta


def hf_gpt2_pair(n_layers: int, d_model: int, n_heads: int, n_ctx: int, d_vocab: int,
                 seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """``(ours, bridge)``: a random Hugging Face GPT-2 in a ``TransformerBridge`` (compatibility mode)
    and our :class:`harness.Transformer` with the same weights (:func:`harness.model.convert.from_hf`).

    Built in memory from a config: nothing is downloaded. Dropout is 0, both are in eval mode.
    """
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
    from transformers import GPT2Config, GPT2LMHeadModel

    from harness.model.convert import from_hf

    config = GPT2Config(n_layer=n_layers, n_embd=d_model, n_head=n_heads, n_positions=n_ctx, vocab_size=d_vocab,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    with torch.random.fork_rng(devices=[]):  # HF initializes from the global generator: leave it as it was
        torch.manual_seed(seed)
        hf = GPT2LMHeadModel(config).eval()
    ours = from_hf(hf)  # before bridging: the bridge replaces hf's submodules in place
    bridge = build_bridge_from_module(hf, "GPT2LMHeadModel", hf_config=hf.config)
    bridge.enable_compatibility_mode()
    return ours.eval(), bridge.eval()
