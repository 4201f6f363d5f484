"""The probes on a Hugging Face GPT-2 wrapped in TransformerLens's TransformerBridge.

The bridge follows the hook names of the model protocol but is not our Transformer: its
``start_at_layer`` re-runs the earlier blocks, so the probes gate it without prefix reuse.
References come from the raw Hugging Face model (a pre-hook on ``c_proj`` zeroes a head's slice;
``output_attentions`` gives the patterns), independent of TransformerLens's hooks.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import probes
from probes._validate import model_info

transformers = pytest.importorskip("transformers")
bridge_builder = pytest.importorskip("transformer_lens.model_bridge.sources._bridge_builder")

N_LAYER, N_HEAD, N_EMBD, VOCAB = 2, 4, 32, 40
D_HEAD = N_EMBD // N_HEAD
# The bridge's hooks sit in the same float32 computation as the raw model: differences of
# losses agree to float32 rounding of a ~ln(40) loss; 1e-5 is the bar for identical numbers
# (tests/test_probes.py ATOL).
ATOL = 1e-5


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD, vocab_size=VOCAB,
                                     n_positions=32, attn_implementation="eager")
    hf = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():  # a dead head: layer 1, head 2 writes nothing through its c_proj rows
        hf.transformer.h[1].attn.c_proj.weight[2 * D_HEAD:3 * D_HEAD] = 0
    hf.train()  # dropout on: the probes must switch it off themselves
    bridge = bridge_builder.build_bridge_from_module(hf, "GPT2LMHeadModel", hf_config=hf.config)
    bridge.enable_compatibility_mode()
    return hf, bridge


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, VOCAB, (4, 10), generator=torch.Generator().manual_seed(1))


def hf_loss(hf, tokens, zero=None) -> float:
    """Next-token loss of the raw HF model, optionally with head ``zero=(layer, head)`` removed."""
    handle = None
    if zero is not None:
        layer, head = zero

        def pre(module, args):
            x = args[0].clone()
            x[..., head * D_HEAD:(head + 1) * D_HEAD] = 0  # c_proj's input is the heads' outputs, concatenated
            return (x,)
        handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(pre)
    was = hf.training
    hf.eval()
    try:
        with torch.no_grad():
            logits = hf(tokens).logits
    finally:
        hf.train(was)
        if handle is not None:
            handle.remove()
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1).double(), tokens[:, 1:].flatten()))


def test_bridge_is_probed_without_prefix_reuse(pair):
    _, bridge = pair
    info = model_info(bridge, need_pattern=True)
    assert (info.n_layers, info.n_heads, info.d_vocab) == (N_LAYER, N_HEAD, VOCAB)
    assert not info.prefix_reuse and info.takes_attention_mask


def test_bridge_ablation_equals_hf_head_removal(pair, tokens):
    hf, bridge = pair
    got = probes.head_importance(bridge, tokens).set_index(["layer", "head"])["loss_delta"]
    base = hf_loss(hf, tokens)
    for layer in range(N_LAYER):
        for head in range(N_HEAD):
            assert got[(layer, head)] == pytest.approx(hf_loss(hf, tokens, (layer, head)) - base, abs=ATOL)
    assert abs(got[(1, 2)]) <= 1e-6  # the dead head
    assert bridge.training and hf.training  # dropout state restored


def test_bridge_gradient_and_mean_ablation(pair, tokens):
    _, bridge = pair
    grad = probes.head_importance(bridge, tokens, method="gradient").set_index(["layer", "head"])
    assert grad.loc[(1, 2), "importance"] <= 1e-6 and (grad.importance.drop((1, 2)) > 1e-5).all()
    mean = probes.head_importance(bridge, tokens, method="mean_ablation")
    assert mean.loss_delta.notna().all() and len(mean) == N_LAYER * N_HEAD
    assert all(p.grad is None for p in bridge.parameters())


def test_bridge_prune_curve_and_redundancy(pair, tokens):
    hf, bridge = pair
    curve = probes.prune_curve(bridge, tokens, order=("importance", "random"), fractions=[0, 0.125, 1], seeds=(0,),
                               method="gradient")
    first = curve[(curve.order == "importance") & (curve.n_pruned == 1)].loss.iloc[0]
    assert first == pytest.approx(hf_loss(hf, tokens), abs=ATOL)  # the dead head goes first, changing nothing
    red = probes.redundancy(bridge, tokens, tolerance=0.05, seeds=(0,))
    assert red.baseline_loss == pytest.approx(hf_loss(hf, tokens), abs=ATOL)
    assert red.prunable_heads >= 1  # at least the dead head


def test_bridge_patterns_match_hf_attentions(pair, tokens):
    hf, bridge = pair
    hf.eval()
    with torch.no_grad():
        attentions = hf(tokens, output_attentions=True).attentions  # per layer [b, n_heads, q, k]
    hf.train()
    roles = probes.head_roles(bridge, tokens).set_index(["layer", "head"])
    ent = probes.attention_entropy(bridge, tokens).set_index(["layer", "head"])
    sim = probes.head_similarity(bridge, tokens)
    for layer, a in enumerate(attentions):
        a = a.double()
        prev = a.diagonal(offset=-1, dim1=-2, dim2=-1).mean((0, 2))  # [n_heads]: weight on key q-1
        first = a[..., 1:, 0].mean((0, 2))
        entropy = -torch.special.xlogy(a, a).sum(-1)[..., 1:].mean((0, 2))
        for head in range(N_HEAD):
            assert roles.loc[(layer, head), "previous_token"] == pytest.approx(float(prev[head]), abs=1e-5)
            assert roles.loc[(layer, head), "first_token"] == pytest.approx(float(first[head]), abs=1e-5)
            assert ent.loc[(layer, head), "entropy"] == pytest.approx(float(entropy[head]), abs=1e-5)
    assert sim.shape == (N_LAYER * N_HEAD,) * 2
    assert (sim.to_numpy().diagonal() == pytest.approx(1.0, abs=1e-6))
