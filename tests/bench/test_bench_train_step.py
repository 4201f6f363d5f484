"""Training step (forward, backward, AdamW) of our unhooked Transformer vs a plain minimal GPT."""

import pytest
import torch
import torch.nn.functional as F

from harness import ModelConfig, Transformer
from tests.bench.common import FULL, interleaved_medians, report
from tests.bench.plain_gpt import PlainGPT

pytestmark = pytest.mark.bench


def make_step(model, tokens):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def test_train_step_vs_plain_gpt(benchmark):
    L, d, h, T, B, V = 4, 256, 8, 128, 16, 512  # the Foundation issue's shape
    cfg = ModelConfig(n_layers=L, d_model=d, n_heads=h, n_ctx=T, d_vocab=V, act_fn="gelu")
    ours, plain = Transformer(cfg), PlainGPT(L, d, h, T, V)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in plain.parameters())
    tokens = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(0))
    steps = {"ours": make_step(ours, tokens), "plain": make_step(plain, tokens)}
    med = interleaved_medians(steps, rounds=15 if FULL else 6)
    ratio = med["plain"] / med["ours"]  # > 1 means ours is faster
    report(benchmark, "train step L4 d256 T128 B16 V512", ours_s=med["ours"], plain_s=med["plain"],
           speed_ratio=ratio)
    benchmark.pedantic(steps["ours"], rounds=2, iterations=1)
    assert ratio > 0.5, "grossly slower than a plain GPT: something regressed badly"
