"""probes.patch_residual against TransformerLens's own residual patching (the independent reference)."""

import pytest
import torch
from transformer_lens import patching

from harness import ModelConfig, Transformer
from probes.patching import patch_residual

pytestmark = pytest.mark.usefixtures("one_thread")


def metric(logits):
    return logits[:, -1].log_softmax(-1)[:, 5].mean()


def _model(positional="standard"):
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layers=3, d_model=32, n_heads=4, d_vocab=40, n_ctx=16,
                                   positional_embedding_type=positional)).eval()


def _inputs():
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 40, (3, 9), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = (corrupted[:, 2] + 11) % 40
    return clean, corrupted


@pytest.mark.parametrize("positional", ["standard", "rotary"])
def test_equals_transformer_lens_patching(positional):
    model = _model(positional)
    clean, corrupted = _inputs()
    _, cache = model.run_with_cache(clean)
    ref = patching.get_act_patch_resid_pre(model, corrupted, cache, metric).double()
    ours = patch_residual(model, clean, corrupted, metric)
    # float32 passes of different batch sizes: summation order differs by a few ulps
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    # the patch matters: at the corrupted position, patching layer 0 restores the clean metric
    with torch.no_grad():
        clean_metric, corrupted_metric = float(metric(model(clean))), float(metric(model(corrupted)))
    assert abs(float(ours[0, 2]) - clean_metric) < 1e-5
    assert float((ours - corrupted_metric).abs().max()) > 1e-3


def test_without_prefix_reuse_and_small_batches_gives_the_same_table(monkeypatch):
    model = _model()
    clean, corrupted = _inputs()
    full = patch_residual(model, clean, corrupted, metric)
    import probes.patching as mod

    real = mod.model_info

    def no_reuse(m, **kw):
        import dataclasses
        return dataclasses.replace(real(m, **kw), prefix_reuse=False)

    monkeypatch.setattr(mod, "model_info", no_reuse)
    torch.testing.assert_close(patch_residual(model, clean, corrupted, metric, batch_size=4), full, atol=1e-5, rtol=0)


def test_subsets_leave_nan_elsewhere():
    model = _model()
    clean, corrupted = _inputs()
    out = patch_residual(model, clean, corrupted, metric, layers=[1], positions=[0, 2])
    assert out.shape == (3, 9)
    assert torch.isnan(out).sum() == 3 * 9 - 2
    full = patch_residual(model, clean, corrupted, metric)
    torch.testing.assert_close(out[1, [0, 2]], full[1, [0, 2]], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(clean_tokens=torch.zeros(2, 3)), "clean_tokens"),
    (dict(corrupted_tokens=torch.zeros(2, 4, dtype=torch.long)), "different shapes"),
    (dict(corrupted_tokens=torch.full((3, 9), 40)), "corrupted_tokens"),
    (dict(metric="loss"), "metric"),
    (dict(layers=[3]), "layers"),
    (dict(layers=[]), "layers"),
    (dict(positions=[9]), "positions"),
    (dict(positions=[True]), "positions"),
])
def test_bad_input_is_refused_before_any_pass(kwargs, match):
    model = _model()
    clean, corrupted = _inputs()
    calls = []
    model.embed.register_forward_hook(lambda *a: calls.append(1))
    args = dict(clean_tokens=clean, corrupted_tokens=corrupted, metric=metric) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        patch_residual(model, **args)
    assert not calls


def every_position(logits):
    """A metric that reads every position: the mean log-probability of token 5 over the whole sequence."""
    return logits.log_softmax(-1)[..., 5].mean()


@pytest.mark.parametrize("cfg", [dict(), dict(positional_embedding_type="rotary", n_key_value_heads=2),
                                 dict(positional_embedding_type="alibi", norm_placement="post"),
                                 dict(positional_embedding_type="sinusoidal", attn_only=True)])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_suffix_passes_equal_transformer_lens_on_every_position(cfg, batch_size):
    """The suffix route (positions before the patch taken from the corrupted run) against TransformerLens's one
    full pass per (layer, position), with a metric that reads the logits of every position."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(n_layers=3, d_model=32, n_heads=4, d_vocab=40, n_ctx=16, init_range=0.2,
                                    **cfg)).eval()
    clean, corrupted = _inputs()
    _, cache = model.run_with_cache(clean)
    ref = patching.get_act_patch_resid_pre(model, corrupted, cache, every_position).double()
    ours = patch_residual(model, clean, corrupted, every_position, batch_size=batch_size)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    assert float((ours - ours[:, :1]).abs().max()) > 1e-3  # positions differ: the table is not one number


@pytest.mark.parametrize("route", ["suffix", "prefix", "tokens"])
def test_every_route_gives_the_same_table(monkeypatch, route):
    import dataclasses

    import probes.patching as mod
    model = _model("rotary")
    clean, corrupted = _inputs()
    want = patch_residual(model, clean, corrupted, every_position, positions=[1, 2, 6, 8])
    if route == "prefix":  # the batched passes from layer l over every position
        monkeypatch.setattr(mod, "_suffix_route", lambda m, info: False)
    elif route == "tokens":  # no partial runs at all
        real = mod.model_info
        monkeypatch.setattr(mod, "model_info", lambda m, **kw: dataclasses.replace(real(m, **kw), prefix_reuse=False))
    got = patch_residual(model, clean, corrupted, every_position, positions=[1, 2, 6, 8])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0, equal_nan=True)


def test_suffix_passes_compute_only_the_positions_a_patch_can_change():
    """Patching positions 6 and 8 of 9 at each of 3 layers: every pass after the corrupted and clean runs sees
    only positions 6.. (3 or 1 of them), not 9."""
    model = _model()
    clean, corrupted = _inputs()
    widths: list[int] = []
    model.unembed.register_forward_hook(lambda mod, args, out: widths.append(out.shape[1]))
    patch_residual(model, clean, corrupted, every_position, positions=[6, 8])
    assert widths[0] == 9 and set(widths[1:]) <= {1, 3} and len(widths) >= 1 + 3
    assert sum(widths[1:]) <= 3 * (3 + 3)  # at most: both patches in one pass from 6, at each layer


def _cost(groups, pos, rows, overhead):
    return sum(overhead + len(g) * rows * (pos - g[0]) for g in groups)


@pytest.mark.parametrize("seed", range(20))
def test_position_groups_split_at_least_cost(seed):
    """Against every split of the sorted positions into runs (brute force over the 2**(n-1) cut sets)."""
    import itertools
    import random

    from probes.patching import position_groups
    rng = random.Random(seed)
    pos, rows, overhead, max_k = rng.randint(4, 40), rng.randint(1, 8), rng.choice([0, 5, 64]), rng.randint(1, 5)
    positions = sorted(rng.sample(range(pos), rng.randint(1, min(pos, 8))))
    groups = position_groups(positions, pos, rows, max_k, overhead)
    assert [p for g in groups for p in g] == positions and all(1 <= len(g) <= max_k for g in groups)
    n, best = len(positions), float("inf")
    for cuts in itertools.product([0, 1], repeat=n - 1):
        split, run = [], [positions[0]]
        for p, cut in zip(positions[1:], cuts, strict=True):
            if cut:
                split.append(run)
                run = []
            run.append(p)
        split.append(run)
        if all(len(g) <= max_k for g in split):
            best = min(best, _cost(split, pos, rows, overhead))
    assert _cost(groups, pos, rows, overhead) == best
