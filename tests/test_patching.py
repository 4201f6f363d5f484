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
