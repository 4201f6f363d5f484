"""The pass runner at scale: memory-bounded passes, reused prefixes, early-stopping curves,
exact answers for a subset of heads, and attribution patching, each against the plain computation.

Tolerances: losses are ~ln(d_vocab) ~ 3-4 in float32; two routes that differ only in summation order
and batch blocking agree to a few float32 ulps of that (~1e-6), so 1e-5 (tests/test_probes.py ATOL)
is "the same numbers". The attribution check is a derivative: it is compared in float64 with a
central difference, whose error is O(eps^2).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import probes
from harness import ModelConfig, Transformer
from harness.adapters import HFAdapter
from probes import _head_stats, _nll, gates
from probes._validate import model_info, probe_data
from probes.attribution import attribution
from probes.importance import leave_one_out
from probes.pruning import _cumulative_masks, _prunable, _random_order
from reports.bench.reference import naive_head_ablation, reference_loss
from tests.helpers.hf_zoo import ZOO, V

ATOL = 1e-5


def tiny(**overrides) -> Transformer:
    cfg = dict(n_layers=3, d_model=32, n_heads=4, d_vocab=24, n_ctx=16, init_range=0.3, seed=3)
    cfg.update(overrides)
    return Transformer(ModelConfig(**cfg)).eval()


def tokens(n=6, pos=12, d_vocab=24, seed=0):
    return torch.randint(0, d_vocab, (n, pos), generator=torch.Generator().manual_seed(seed))


def hf_llama():
    torch.manual_seed(0)
    return HFAdapter(ZOO["llama"]().eval())


@pytest.mark.parametrize("which", ["transformer", "hf llama"])
def test_loo_equals_one_plain_forward_per_head(which):
    """Prefix reuse (our Transformer, and an HF model through HFAdapter's partial runs), batched heads: the naive
    loop's numbers."""
    model = tiny() if which == "transformer" else hf_llama()
    tok = tokens(d_vocab=24 if which == "transformer" else V)
    info = model_info(model)
    assert info.prefix_reuse  # both start mid-stack (harness/adapters/hf_partial.py)
    want = naive_head_ablation(model, tok)
    got, _ = leave_one_out(model, info, probe_data(info, tok))
    assert float((got - want).abs().max()) <= ATOL
    # a subset: the same heads' numbers, NaN elsewhere
    heads = torch.tensor([1, 5, 7])
    sub, _ = leave_one_out(model, info, probe_data(info, tok), heads=heads)
    flat = sub.flatten()
    assert torch.isnan(flat[[i for i in range(len(flat)) if i not in heads.tolist()]]).all()
    assert float((flat[heads] - want.flatten()[heads]).abs().max()) <= ATOL


def test_head_means_skips_the_unembedding_and_keeps_its_numbers():
    model = tiny()
    info = model_info(model)
    data = probe_data(info, tokens())
    seen = []
    handle = model.unembed.register_forward_hook(lambda *a: seen.append(1))
    try:
        fast = _head_stats.head_means(model, info, data)
    finally:
        handle.remove()
    assert not seen  # stopped before ln_final and the unembedding
    with torch.no_grad():
        _, cache = model.run_with_cache(data.tokens, names_filter=lambda n: n.endswith("hook_z"))
    want = torch.stack([cache[f"blocks.{layer}.attn.hook_z"].mean(0) for layer in range(3)])
    assert float((fast - want).abs().max()) <= ATOL


def test_head_means_end_at_the_last_head_output_on_an_hf_model():
    """The means pass ends at the last ``hook_z``, so neither the last layer's MLP nor ``lm_head`` runs, and the
    means equal those of attribution's full forward-backward pass."""
    torch.manual_seed(0)
    hf = ZOO["gpt2"]().eval()
    model = HFAdapter(hf)
    info = model_info(model)
    data = probe_data(info, torch.randint(0, V, (3, 9), generator=torch.Generator().manual_seed(1)))
    seen: list[str] = []
    handles = [hf.lm_head.register_forward_hook(lambda *a: seen.append("lm_head")),
               hf.transformer.h[-1].mlp.register_forward_hook(lambda *a: seen.append("last mlp"))]
    try:
        means = _head_stats.head_means(model, info, data)
    finally:
        for handle in handles:
            handle.remove()
    assert not seen
    assert torch.equal(means, attribution(model, info, data).means)


def test_token_nll_in_slices_equals_one_call(monkeypatch):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 9, 50, generator=g)
    tok = torch.randint(0, 50, (2, 9), generator=g)
    monkeypatch.setattr(_nll, "NLL_ELEMENTS", 1)  # one row per slice
    nll, correct = _nll.token_nll(logits, tok, 3)
    want = F.cross_entropy(logits[:, :-1].flatten(0, 1), tok[:, 1:].repeat(3, 1).flatten(), reduction="none")
    assert torch.equal(nll.flatten(), want)
    assert torch.equal(correct.flatten(), (logits[:, :-1].argmax(-1) == tok[:, 1:].repeat(3, 1)).flatten())


def test_passes_are_bounded_by_the_vocabulary_and_the_backward():
    # SmolLM2-135M: a 49k vocabulary, 30 layers x d_model 576: 64 rows of 128 tokens were 1.6 GB of logits
    assert gates.rows_per_pass(None, 128) == 64
    rows = gates.rows_per_pass(None, 128, d_vocab=49152)
    assert rows * 128 * 49152 <= gates.LOGIT_ELEMENTS and rows >= 1
    info = model_info(tiny())
    big = type(info)(**{**info.__dict__, "n_layers": 30, "d_model": 576, "d_vocab": 49152})
    grad = gates.grad_rows(None, big, 128)
    assert 1 <= grad < rows
    assert grad * 128 * 4 * (gates.GRAD_FLOATS_PER_TOKEN * 30 * 576 + 3 * 49152) <= gates.GRAD_ACTIVATION_BYTES


def test_masked_stats_until_stops_at_the_first_broken_mask(monkeypatch):
    model = tiny()
    info = model_info(model)
    data = probe_data(info, tokens())
    masks = _cumulative_masks(_random_order(0, 12), list(range(13)), 3, 4)
    full, _ = gates.masked_stats(model, info, data, masks)
    limit = float(full[0]) * 1.02
    calls = []
    real = gates.masked_stats
    monkeypatch.setattr(gates, "masked_stats", lambda *a, **k: calls.append(1) or real(*a, **k))
    got, _ = gates.masked_stats_until(model, info, data, masks, lambda loss, acc: loss > limit, chunk=2)
    first = int((full > limit).nonzero()[0])
    done = ~torch.isnan(got)
    assert first < 11 and int(done.sum()) == 2 * (first // 2 + 1) and len(calls) == first // 2 + 1
    assert float((got[done] - full[done]).abs().max()) <= ATOL
    assert _prunable(got > limit) == _prunable(full > limit)


def test_redundancy_reads_the_same_curves_with_fewer_passes():
    model = tiny()
    tok = tokens()
    got = probes.redundancy(model, tok, tolerance=0.02, seeds=(0, 1))
    info = model_info(model)
    data = probe_data(info, tok)
    ranking = torch.sort(_head_stats.gate_gradients(model, info, data)[0].flatten().cpu(), stable=True).indices
    for order, key in ((ranking, "prunable_heads"),):
        loss, _ = gates.masked_stats(model, info, data, _cumulative_masks(order, list(range(13)), 3, 4))
        assert got[key] == _prunable(loss > float(loss[0]) * 1.02)
    rand = [_prunable(gates.masked_stats(model, info, data, _cumulative_masks(_random_order(s, 12),
                                                                                list(range(13)), 3, 4))[0]
                      > float(got["baseline_loss"]) * 1.02) for s in (0, 1)]
    assert got["random_prunable_fraction"] == pytest.approx(sum(rand) / 2 / 12)
    headline = probes.redundancy(model, tok, tolerance=0.02, seeds=(0, 1), per_layer=False)
    assert set(headline.index) < set(got.index) and not any(k.endswith("_L0") for k in headline.index)
    assert all(headline[k] == got[k] for k in headline.index)


def test_attribution_is_the_derivative_of_mean_ablation():
    """d/de loss(z + e (mean - z)) at e = 0, by a central difference in float64, equals the estimate."""
    model = tiny().double()
    info = model_info(model)
    data = probe_data(info, tokens())
    a = attribution(model, info, data)
    torch.testing.assert_close(a.means.double(), _head_stats.head_means(model, info, data).double(), atol=1e-6, rtol=0)
    grad, zero = _head_stats.gate_gradients(model, info, data)
    torch.testing.assert_close(a.gradient, grad, atol=1e-12, rtol=1e-9)
    torch.testing.assert_close(a.zero_delta, zero, atol=1e-12, rtol=1e-9)
    eps = 1e-3
    means = a.means.double()

    def loss_at(e: float, layer: int, head: int) -> float:
        def shift(z, hook, layer=layer):
            z = z.clone()
            z[..., head, :] += e * (means[layer, : z.shape[1], head] - z[..., head, :])
            return z
        return reference_loss(model, data.tokens, [(f"blocks.{layer}.attn.hook_z", shift)])  # float64 throughout

    for layer, head in ((0, 1), (2, 3)):
        numeric = (loss_at(eps, layer, head) - loss_at(-eps, layer, head)) / (2 * eps)
        # central difference: O(eps^2) truncation, float64 rounding far below it
        assert math.isclose(float(a.mean_delta[layer, head]), numeric, rel_tol=1e-4, abs_tol=1e-9), (layer, head)
    # and it is a different number from the zero-ablation estimate: the replacement matters
    assert float((a.mean_delta - a.zero_delta).abs().max()) > 1e-3


def test_head_importance_attribution_and_heads_subset():
    model = tiny()
    tok = tokens()
    frame = probes.head_importance(model, tok, method="attribution")
    assert frame["importance"].equals(frame["loss_delta"]) and frame["importance"].notna().all()
    part = probes.head_importance(model, tok, heads=[0, 11])
    assert part["loss_delta"].notna().sum() == 2
    with pytest.raises(ValueError, match="heads="):
        probes.head_importance(model, tok, heads=[12])
    with pytest.raises(ValueError, match="heads="):
        probes.head_importance(model, tok, method="gradient", heads=[0])


def test_argmax_is_is_argmax_equality_with_ties_nan_and_inf():
    """token_nll's correctness test reads argmax only where the target can be it: the same booleans as
    ``argmax(-1) == target`` on logits full of ties (argmax takes the first), NaN (argmax's maximum) and infinities."""
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        v = int(torch.randint(2, 9, (1,), generator=g))
        x = torch.randint(0, 3, (3, 5, v), generator=g).float()
        for value in (float("nan"), float("inf"), float("-inf")):
            x[torch.rand(x.shape, generator=g) < 0.05] = value
        t = torch.randint(0, v, (3, 5), generator=g)
        assert torch.equal(_nll._argmax_is(x, t), x.argmax(-1) == t)
