"""Probes on small models against independent references: a naive one-forward-per-head loop,
per-sequence autograd, float64 Jensen-Shannon, and closed forms on a hand-built protocol model."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import probes
from harness import ModelConfig, Transformer
from probes import _head_stats, gates
from probes._validate import model_info, probe_data
from probes.roles import role_key_sets
from reports.bench.reference import naive_head_ablation, reference_loss
from tests.helpers.fixed_pattern import FixedPatternModel

# Losses are ~ln(d_vocab) ~ 3 in float32; the batched and naive routes differ only in summation
# order and batch blocking, so differences of losses agree to a few float32 ulps of 3 (~3e-7 each).
# 1e-5, ~30x that rounding, is the bar for "identical numbers".
ATOL = 1e-5


def tiny(**overrides) -> Transformer:
    cfg = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=24, n_ctx=16, init_range=0.3, seed=3)
    cfg.update(overrides)
    return Transformer(ModelConfig(**cfg)).eval()


def data(n=5, pos=12, d_vocab=24, seed=0):
    return torch.randint(0, d_vocab, (n, pos), generator=torch.Generator().manual_seed(seed))


def grid(frame: pd.DataFrame, column: str) -> torch.Tensor:
    L, H = int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1
    return torch.tensor(frame.sort_values(["layer", "head"])[column].to_numpy()).view(L, H)


CONFIGS = {
    "pre-LN gelu MLP": {},
    "rotary attn-only": dict(positional_embedding_type="rotary", attn_only=True),
    "alibi RMS": dict(positional_embedding_type="alibi", normalization_type="RMS"),
    "bidirectional post-norm": dict(attention_dir="bidirectional", norm_placement="post", n_layers=3),
    "GQA sinusoidal": dict(n_key_value_heads=2, positional_embedding_type="sinusoidal"),
}


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_batched_ablation_equals_naive_loop(overrides):
    model = tiny(**overrides)
    tokens = data()
    got = probes.head_importance(model, tokens)
    want = naive_head_ablation(model, tokens)
    torch.testing.assert_close(grid(got, "loss_delta"), want, atol=ATOL, rtol=0)
    assert got["importance"].equals(got["loss_delta"])  # unnormalized ablation: the importance is the loss change
    assert got.attrs["baseline_loss"] == pytest.approx(reference_loss(model, tokens), abs=ATOL)


def test_ablation_with_padding_loss_mask_and_small_batches():
    model = tiny()
    tokens = data(n=6)
    am = torch.ones_like(tokens)
    am[0, :3] = 0  # left padding
    am[1, -2:] = 0  # right padding
    lm = torch.zeros_like(tokens, dtype=torch.bool)
    lm[:, 6:] = True
    want = naive_head_ablation(model, tokens, loss_mask=lm, attention_mask=am)
    for batch_size in (None, 1, 4, 7):  # 1: one sequence and one mask per pass; 4, 7: ragged chunks
        got = probes.head_importance(model, tokens, loss_mask=lm, attention_mask=am, batch_size=batch_size)
        torch.testing.assert_close(grid(got, "loss_delta"), want, atol=ATOL, rtol=0)


def test_prefix_reuse_changes_no_number():
    """Random multi-layer masks, with and without prefix reuse, against a base mask: same losses."""
    model = tiny(n_layers=3)
    info = model_info(model)
    assert info.prefix_reuse  # our Transformer can stop and start at a layer
    d = probe_data(info, data())
    g = torch.Generator().manual_seed(1)
    masks = (torch.rand(9, 3, 4, generator=g) > 0.4).float()
    masks[0] = 1
    base = masks[3]
    fast = gates.masked_stats(model, info, d, masks, base=base, batch_size=7)
    slow = gates.masked_stats(model, dataclasses.replace(info, prefix_reuse=False), d, masks)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    for i in (0, 5):  # and against plain forwards with the mask applied by hand
        hooks = [(f"blocks.{layer}.attn.hook_z",
                  lambda z, hook, m=masks[i, layer]: z * m[None, None, :, None]) for layer in range(3)]
        assert float(fast[0][i]) == pytest.approx(reference_loss(model, d.tokens, hooks), abs=ATOL)


def test_mean_ablation_uses_per_position_means():
    model = tiny()
    tokens = data(n=7)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    per_position = [cache[f"blocks.{layer}.attn.hook_z"].mean(0) for layer in range(2)]  # [pos, n_heads, d_head]
    want = naive_head_ablation(model, tokens, replacement=per_position)
    got = probes.head_importance(model, tokens, method="mean_ablation")
    torch.testing.assert_close(grid(got, "loss_delta"), want, atol=ATOL, rtol=0)
    # a mean over positions too would be a different replacement, with different numbers
    pooled = [z.mean(0, keepdim=True).expand_as(z) for z in per_position]
    assert (naive_head_ablation(model, tokens, replacement=pooled) - want).abs().max() > 1e-3
    # and head_means itself is the per-position mean over sequences (run_with_cache hooks the pattern,
    # which takes the explicit softmax path; head_means runs SDPA: kernels differ by float32 rounding)
    info = model_info(model)
    torch.testing.assert_close(_head_stats.head_means(model, info, probe_data(info, tokens)), torch.stack(per_position),
                               atol=1e-5, rtol=0)


def test_gradient_importance_matches_per_sequence_autograd():
    """Michel et al. 2019: I_h = E_x |dL(x)/dxi_h|, recomputed one sequence at a time."""
    model = tiny()
    tokens = data(n=4)
    L, H = 2, 4
    per_seq = []
    for i in range(tokens.shape[0]):
        xi = torch.ones(L, H, requires_grad=True)
        hooks = [(f"blocks.{layer}.attn.hook_z", lambda z, hook, layer=layer, xi=xi: z * xi[layer][None, None, :, None])
                 for layer in range(L)]
        with model.hooks(fwd_hooks=hooks):
            logits = model(tokens[i:i + 1])
        loss = F.cross_entropy(logits[0, :-1], tokens[i, 1:])
        per_seq.append(torch.autograd.grad(loss, xi)[0])
    grads = torch.stack(per_seq).double()
    got = probes.head_importance(model, tokens, method="gradient")
    # float32 backward through the same graph; summation order differs with the batch
    torch.testing.assert_close(grid(got, "importance"), grads.abs().mean(0), atol=1e-6, rtol=1e-4)
    # equal-length sequences: the token-weighted gradient is the mean per-sequence gradient
    torch.testing.assert_close(grid(got, "loss_delta"), -grads.mean(0), atol=1e-6, rtol=1e-4)
    normed = grid(probes.head_importance(model, tokens, method="gradient", normalize=True), "importance")
    torch.testing.assert_close(normed.norm(dim=1), torch.ones(L, dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(normed, grads.abs().mean(0) / grads.abs().mean(0).norm(dim=1, keepdim=True),
                               atol=1e-6, rtol=1e-4)


def plant_dead_heads(model, heads):
    dh = model.cfg.d_head
    with torch.no_grad():
        for layer, h in heads:
            model.blocks[layer].attn.o.weight[:, h * dh:(h + 1) * dh] = 0  # W_O[h] = 0: the head writes nothing
    return model


def test_dead_heads_are_zero_and_pruned_first():
    model = plant_dead_heads(tiny(seed=5, init_range=0.5), [(0, 1), (1, 2)])
    # the model's own greedy continuations: every live head then carries some of its predictions
    tokens = model.generate(data(n=6, pos=3, seed=4), 11, temperature=0)
    dead = torch.zeros(2, 4, dtype=torch.bool)
    dead[0, 1] = dead[1, 2] = True
    ablation = grid(probes.head_importance(model, tokens), "importance")
    gradient = grid(probes.head_importance(model, tokens, method="gradient"), "importance")
    assert ablation[dead].abs().max() <= 1e-6 and gradient[dead].abs().max() <= 1e-6
    assert ablation[~dead].min() > 1e-4 and gradient[~dead].min() > 1e-4  # so "first" means something below
    for method in ("ablation", "gradient"):
        curve = probes.prune_curve(model, tokens, method=method, fractions=[0, 2 / 8, 3 / 8])
        loss = curve.set_index("n_pruned")["loss"]
        assert loss[2] == pytest.approx(loss[0], abs=1e-6)  # the two dead heads went first: no change
        assert loss[3] > loss[0] + 1e-4  # the next one is alive


def test_identical_heads_have_pattern_similarity_one():
    model = tiny(n_layers=2)
    dh, d = model.cfg.d_head, model.cfg.d_model
    with torch.no_grad():
        qkv = model.blocks[0].attn.qkv
        for part in range(3):  # rows of Q, K and V for head 2 := those of head 0
            src = slice(part * d + 0 * dh, part * d + 1 * dh)
            dst = slice(part * d + 2 * dh, part * d + 3 * dh)
            qkv.weight[dst] = qkv.weight[src]
            qkv.bias[dst] = qkv.bias[src] + 0.0
    tokens = data(n=4)
    sim = probes.head_similarity(model, tokens)
    assert list(sim.index) == [f"L{layer}H{h}" for layer in range(2) for h in range(4)] == list(sim.columns)
    assert sim.loc["L0H0", "L0H2"] == pytest.approx(1.0, abs=1e-6)
    assert (sim.drop(index="L0H2", columns="L0H2").to_numpy() < 1 - 1e-4).sum() == 7 * 6  # all other pairs differ
    assert (sim.to_numpy() == sim.to_numpy().T).all() and ((sim >= 0) & (sim <= 1)).all().all()

    # independent float64 reference for one pair: JSD = (KL(p||m) + KL(q||m)) / 2 in bits
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    p = cache["blocks.0.attn.hook_pattern"][:, 0].double()
    q = cache["blocks.1.attn.hook_pattern"][:, 3].double()
    m = (p + q) / 2
    kl = lambda a, b: torch.where(a > 0, a * (a / b).log(), torch.zeros_like(a)).sum(-1)  # noqa: E731
    jsd = ((kl(p, m) + kl(q, m)) / 2 / math.log(2))[:, 1:]  # query 0 sees one key: not informative
    assert sim.loc["L0H0", "L1H3"] == pytest.approx(1 - float(jsd.mean()), abs=1e-6)

    cka = probes.head_similarity(model, tokens, metric="output")
    assert cka.loc["L0H0", "L0H2"] == pytest.approx(1.0, abs=1e-6)  # identical outputs
    assert (cka.to_numpy().diagonal() == pytest.approx(1.0, abs=1e-9))
    # linear CKA reference (Kornblith et al. 2019) for one pair, on centred features; the cache comes from
    # the explicit attention path, the probe's z from SDPA: float32 kernel rounding, hence 1e-6
    x = cache["blocks.0.attn.hook_z"][..., 0, :].flatten(0, 1).double()
    y = cache["blocks.1.attn.hook_z"][..., 1, :].flatten(0, 1).double()
    x, y = x - x.mean(0), y - y.mean(0)
    ref = (y.T @ x).norm() ** 2 / ((x.T @ x).norm() * (y.T @ y).norm())
    assert cka.loc["L0H0", "L1H1"] == pytest.approx(float(ref), abs=1e-6)


def test_role_key_sets_match_a_loop():
    tokens = torch.tensor([[1, 2, 3, 1, 2, 3, 2], [5, 5, 1, 5, 2, 2, 1]])
    real = torch.ones_like(tokens, dtype=torch.bool)
    real[1, :2] = False  # left padding
    sets = role_key_sets(tokens, real)
    for b in range(2):
        first = int(real[b].long().argmax())
        for q in range(7):
            for k in range(7):
                ok = bool(real[b, q] and real[b, k])
                t = tokens[b]
                assert bool(sets["previous_token"][b, q, k]) == (ok and k == q - 1)
                assert bool(sets["duplicate_token"][b, q, k]) == (ok and k < q and t[k] == t[q])
                assert bool(sets["induction"][b, q, k]) == (ok and 1 <= k < q and bool(real[b, k - 1])
                                                            and t[k - 1] == t[q])
                assert bool(sets["first_token"][b, q, k]) == (ok and k == first and q > first)


def test_roles_and_entropy_on_rule_heads():
    """A protocol HookedRootModule whose heads attend by rule; every score has a closed form."""
    model = FixedPatternModel()
    tokens = torch.tensor([[3, 4, 5, 6, 3, 4, 5, 6, 7, 8], [1, 2, 1, 2, 1, 2, 9, 9, 9, 9]])
    roles = probes.head_roles(model, tokens).set_index("head")
    for h, role in enumerate(FixedPatternModel.RULES):
        if role in roles.columns:
            assert roles.loc[h, role] == pytest.approx(1.0, abs=1e-6), role
    # the uniform head puts 1/(q+1) on the previous token at query q
    uniform = FixedPatternModel.RULES.index("uniform")
    assert roles.loc[uniform, "previous_token"] == pytest.approx(sum(1 / (q + 1) for q in range(1, 10)) / 9, abs=1e-6)

    ent = probes.attention_entropy(model, tokens).set_index("head")
    prev = FixedPatternModel.RULES.index("previous_token")
    assert ent.loc[prev, "entropy"] == pytest.approx(0, abs=1e-6)
    assert ent.loc[prev, "max_prob"] == ent.loc[prev, "saturated_fraction"] == pytest.approx(1)
    # queries 1..9 see q+1 keys (query 0 sees one: not informative)
    assert ent.loc[uniform, "entropy"] == pytest.approx(sum(math.log(q + 1) for q in range(1, 10)) / 9, abs=1e-5)
    assert ent.loc[uniform, "max_prob"] == pytest.approx(sum(1 / (q + 1) for q in range(1, 10)) / 9, abs=1e-6)
    assert ent.loc[uniform, "saturated_fraction"] == 0
    assert list(ent.reset_index().columns) == ["head", "layer", "entropy", "max_prob", "saturated_fraction"]


def test_probes_run_on_a_protocol_model_without_layer_skipping():
    model = FixedPatternModel()
    info = model_info(model)
    assert not info.prefix_reuse  # its forward has no start_at_layer: masks run from the tokens
    tokens = torch.randint(0, model.cfg.d_vocab, (4, 10), generator=torch.Generator().manual_seed(0))
    got = probes.head_importance(model, tokens)
    torch.testing.assert_close(grid(got, "loss_delta"), naive_head_ablation(model, tokens), atol=ATOL, rtol=0)


def test_prune_curve_shape_orders_and_ends():
    model = tiny()
    tokens = data()
    curve = probes.prune_curve(model, tokens, order=("importance", "random"), fractions=[0, 0.3, 1], seeds=(4, 7),
                               method="ablation")
    assert list(curve.columns) == ["order", "seed", "n_pruned", "fraction_pruned", "loss", "accuracy"]
    assert len(curve) == 3 * 3 and curve.seed.isna().sum() == 3
    assert sorted(curve.n_pruned.unique()) == [0, 2, 8]  # 0.3 * 8 heads rounds to 2
    everything_off = [(f"blocks.{layer}.attn.hook_z", lambda z, hook: z * 0) for layer in range(2)]
    for _, row in curve.iterrows():
        if row.n_pruned == 0:
            assert row.loss == pytest.approx(reference_loss(model, tokens), abs=ATOL)
        if row.n_pruned == 8:
            assert row.loss == pytest.approx(reference_loss(model, tokens, everything_off), abs=ATOL)
    again = probes.prune_curve(model, tokens, order="random", fractions=[0, 0.3, 1], seeds=(4, 7))
    pd.testing.assert_frame_equal(again.reset_index(drop=True),
                                  curve[curve.order == "random"].reset_index(drop=True), check_exact=True)
    # importance order prunes the two least important heads at 0.3
    imp = grid(probes.head_importance(model, tokens), "importance").flatten()
    two = imp.argsort()[:2]
    hooks = [(f"blocks.{int(i) // 4}.attn.hook_z",
              lambda z, hook, h=int(i) % 4: torch.cat([z[:, :, :h], z[:, :, h:h + 1] * 0, z[:, :, h + 1:]], 2))
             for i in two]
    row = curve[(curve.order == "importance") & (curve.n_pruned == 2)].iloc[0]
    assert row.loss == pytest.approx(reference_loss(model, tokens, hooks), abs=ATOL)


def test_reestimate_recomputes_importance_on_the_pruned_model():
    model = tiny(n_layers=2, seed=11)
    tokens = data(seed=2)
    fractions = [i / 8 for i in range(9)]
    once = probes.prune_curve(model, tokens, fractions=fractions, method="ablation")
    again = probes.prune_curve(model, tokens, fractions=fractions, method="ablation", reestimate=True)
    # exact leave-one-out is a greedy search: step 1 is the same choice, and re-estimating on the
    # pruned model picks the best second head given the first, so its loss is as low or lower
    assert again.loss.iloc[1] == pytest.approx(once.loss.iloc[1], abs=ATOL)
    assert again.loss.iloc[2] <= once.loss.iloc[2] + ATOL
    assert again.loss.iloc[-1] == pytest.approx(once.loss.iloc[-1], abs=ATOL)


def test_redundancy_agrees_with_its_curves():
    model = tiny()
    tokens = data()
    tol = 0.05
    red = probes.redundancy(model, tokens, tolerance=tol, seeds=(0, 1))
    curve = probes.prune_curve(model, tokens, order=("importance", "random"),
                               fractions=[i / 8 for i in range(9)], seeds=(0, 1))
    base = red.baseline_loss
    assert base == pytest.approx(reference_loss(model, tokens), abs=ATOL)

    def prunable(losses):  # heads pruned before the loss first leaves the budget
        n = 0
        for loss in losses[1:]:
            if loss > base * (1 + tol):
                break
            n += 1
        return n

    imp = curve[curve.order == "importance"].sort_values("n_pruned").loss.tolist()
    assert red.prunable_heads == prunable(imp) and red.prunable_fraction == prunable(imp) / 8
    rand = [prunable(curve[(curve.order == "random") & (curve.seed == s)].sort_values("n_pruned").loss.tolist())
            for s in (0, 1)]
    assert red.random_prunable_fraction == pytest.approx(sum(rand) / 2 / 8)
    by_acc = probes.redundancy(model, tokens, tolerance=0.02, seeds=(0, 1), criterion="accuracy")
    accs = curve[curve.order == "importance"].sort_values("n_pruned").accuracy.tolist()
    n = next((i - 1 for i, a in enumerate(accs) if a < by_acc.baseline_accuracy - 0.02), 8)
    assert by_acc.prunable_heads == n and by_acc.criterion == "accuracy"
    for layer in range(2):
        assert 0 <= red[f"heads_needed_L{layer}"] <= 4
        best = red[f"one_head_best_L{layer}"]
        keep = [(f"blocks.{layer}.attn.hook_z",
                 lambda z, hook, b=best: z * F.one_hot(torch.tensor(b), 4).float()[None, None, :, None])]
        assert red[f"one_head_rel_increase_L{layer}"] == pytest.approx(
            reference_loss(model, tokens, keep) / base - 1, abs=1e-4)


def test_probes_leave_no_hooks_and_restore_training_mode():
    model = tiny()
    model.train()
    tokens = data(n=3)
    probes.head_importance(model, tokens, method="gradient")
    probes.head_roles(model, tokens)
    assert model.training and all(m.training for m in model.modules())
    assert all(not hp._forward_hooks and not hp._backward_hooks and not hp.fwd_hooks for hp in model.hook_dict.values())
    assert all(p.grad is None for p in model.parameters())  # gradient importance touched no weight gradient
