"""Unit tests of the pieces the field-bug properties stand on: Press et al.'s slopes, the window convention,
the float64 rotation, the declared-design readers, and bad input.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.model.positions import apply_rotary, rotary_cos_sin
from properties.checks.alibi import fitted_slopes, press_slopes
from properties.checks.rotary_phase import rotate
from properties.checks.window import admitted
from properties.design import rotary_design, windows


@pytest.mark.parametrize("n, expected", [
    (1, [2 ** -8]),
    (2, [2 ** -4, 2 ** -8]),
    (3, [2 ** -4, 2 ** -8, 2 ** -2]),  # the 2-head slopes, then the first of the 4-head ones
    (4, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]),
    (6, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]),
    # ofirpress/attention_with_linear_biases#17 lists exactly these for 12 heads
    (12, [2 ** -k for k in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]),
])
def test_press_slopes_by_hand(n, expected):
    torch.testing.assert_close(torch.tensor(press_slopes(n)), torch.tensor(expected), rtol=1e-12, atol=0)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_press_slopes_rejects_bad_head_counts(bad):
    with pytest.raises(ValueError, match="n_heads"):
        press_slopes(bad)


def test_fitted_slopes_recover_a_bias_up_to_row_constants():
    n, slopes = 5, torch.tensor([0.5, 0.125])
    i, j = torch.arange(n)[:, None].double(), torch.arange(n)[None, :].double()
    allowed = j <= i
    row_constant = torch.randn(3, 2, n, 1, dtype=torch.float64)  # what softmax cannot see
    bias = row_constant + slopes.double()[None, :, None, None] * (j - i)
    torch.testing.assert_close(fitted_slopes(bias, allowed, j - i), slopes.double(), rtol=1e-12, atol=1e-12)


def test_window_convention_is_transformers():
    # masking_utils.sliding_window_overlay: kv_idx > q_idx - w (w keys, the query's own included);
    # the bidirectional overlay: |q - kv| <= w
    causal = admitted(6, 3, causal=True)
    assert causal.sum(-1).tolist() == [1, 2, 3, 3, 3, 3]
    assert bool(causal[5, 3]) and not bool(causal[5, 2])
    both = admitted(6, 1, causal=False)
    assert both.sum(-1).tolist() == [2, 3, 3, 3, 3, 2]


def test_rotate_matches_the_harness_rotary():
    # an independent implementation (float64 angles, rotate-half pairs) of the same rotation
    x = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    p = 37
    cos, sin = rotary_cos_sin(torch.full((2, 3), p), 8, dtype=torch.float64)
    torch.testing.assert_close(rotate(x, p, 8, "half", 10000.0), apply_rotary(x, cos[:, :, None], sin[:, :, None]),
                               rtol=1e-12, atol=1e-12)


def test_rotate_keeps_partial_rotary_features_and_norms():
    x = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    for style in ("half", "interleaved"):
        out = rotate(x, 1000, 4, style, 10000.0)
        torch.testing.assert_close(out[..., 4:], x[..., 4:], rtol=0, atol=0)
        torch.testing.assert_close(out[..., :4].norm(dim=-1), x[..., :4].norm(dim=-1), rtol=1e-12, atol=1e-12)


def test_declared_design_readers():
    cfg = SimpleNamespace(n_layers=3, d_head=8)
    assert windows(cfg) == (None, None, None)
    assert windows(SimpleNamespace(n_layers=2, sliding_window=4)) == (4, 4)
    assert windows(SimpleNamespace(n_layers=2, sliding_window=(None, 4))) == (None, 4)
    assert rotary_design(cfg) == (8, "half", 10000.0)
    assert rotary_design(SimpleNamespace(d_head=8, rotary_dim=4, rotary_style="gptj", rotary_base=500.0)) == \
        (4, "interleaved", 500.0)


@pytest.mark.parametrize("bad", [(4,), (4, 0), (4, "x"), 0, (True, None)])
def test_bad_sliding_window_is_one_error(bad):
    with pytest.raises(TypeError, match="sliding_window"):
        windows(SimpleNamespace(n_layers=2, sliding_window=bad))


def test_bad_rotary_style_is_one_error():
    with pytest.raises(TypeError, match="rotary_style"):
        rotary_design(SimpleNamespace(d_head=8, rotary_style="spiral"))


def test_plain_function_makes_hook_level_rows_unobservable_and_runs_finite_outputs():
    # a function model fires no hook: the hook-level properties say why they could not look, never fail;
    # finite_outputs still checks its logits
    from properties import check_model

    emb = torch.nn.Embedding(16, 16)

    def fn(tokens, attention_mask=None, position_offset=0):
        return emb(tokens) @ emb.weight.T

    cfg = dict(n_layers=1, n_heads=2, d_head=8, d_model=16, d_vocab=16, n_ctx=64, positional_embedding_type="rotary",
               attention_dir="causal", sliding_window=(4,))
    names = ["sliding_window", "kernel_consistency", "rotary_precision", "finite_outputs"]
    frame = check_model(fn, cfg=cfg, properties=names, max_examples=3).set_index("property")
    assert frame.loc["finite_outputs", "status"] == "pass"
    for name in names[:3]:
        assert frame.loc[name, "status"] == "unobservable" and "hook" in frame.loc[name, "reason"], name
