"""properties.saturation_sweep: the 1/sqrt(d_k) argument of Vaswani et al. 2017 §3.2.1, measured.

With unit-variance q and k components, q.k has variance d_k: log-log slope 1 unscaled, 0 scaled.
Slope tolerance 0.1: over d_head 8..512 (a factor 64, log 4.16) with 3 seeds, sampling noise in
the variance (~5% per point) moves a fitted slope by ~0.02.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from properties.saturation import COLUMNS, loglog_slope, saturation_sweep, softmax_jacobian_norm

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sweep():
    return saturation_sweep()


def by_d(frame, column, scaled):
    return frame[frame.scaled == scaled].groupby("d_head")[column].mean()


def test_table_shape(sweep):
    assert list(sweep.columns) == COLUMNS
    assert len(sweep) == 7 * 2 * 3
    assert np.isfinite(sweep[COLUMNS[3:]].to_numpy()).all()


def test_score_variance_slopes(sweep):
    assert loglog_slope(sweep, "score_var", False) == pytest.approx(1.0, abs=0.1)
    assert loglog_slope(sweep, "score_var", True) == pytest.approx(0.0, abs=0.1)
    # and the level itself: Var(q.k) = d_k for unit-variance components, 1 after scaling (20%: 3 seeds)
    unscaled = by_d(sweep, "score_var", False)
    np.testing.assert_allclose(unscaled.to_numpy() / unscaled.index.to_numpy(), 1.0, rtol=0.2)
    np.testing.assert_allclose(by_d(sweep, "score_var", True).to_numpy(), 1.0, rtol=0.2)


def test_entropy_collapses_only_unscaled(sweep):
    unscaled, scaled = by_d(sweep, "entropy", False), by_d(sweep, "entropy", True)
    assert (np.diff(unscaled.to_numpy()) < 0).all()  # falls at every doubling of d_head
    assert unscaled.iloc[-1] < 0.2 * unscaled.iloc[0]
    assert by_d(sweep, "max_prob", False).iloc[-1] > 0.9  # one key takes almost all the weight
    # scaled: flat, near the log(32) = 3.47 nats of a uniform row minus the spread of unit-variance scores
    np.testing.assert_allclose(scaled.to_numpy(), scaled.mean(), rtol=0.05)
    assert by_d(sweep, "max_prob", True).max() < 0.25


def test_jacobian_falls_only_unscaled(sweep):
    unscaled = by_d(sweep, "jacobian_norm", False)
    assert (np.diff(unscaled.to_numpy()) < 0).all()
    assert loglog_slope(sweep, "jacobian_norm", False) < -0.2
    assert loglog_slope(sweep, "jacobian_norm", True) == pytest.approx(0.0, abs=0.05)


def test_gradient_reaching_qk(sweep):
    # Scaled: the gradient reaching q and k does not depend on d_k. Unscaled, a non-saturating softmax
    # would pass dL/dq = sum_j dL/ds_ij k_j with |k| ~ sqrt(d_k) (slope 0.5); saturation takes part of it away.
    assert loglog_slope(sweep, "qk_grad_norm", True) == pytest.approx(0.0, abs=0.1)
    assert loglog_slope(sweep, "qk_grad_norm", False) < 0.4


def test_jacobian_norm_matches_autograd():
    # independent reference: the full softmax Jacobian from autograd, float64 (1e-10: rounding only)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        s = torch.randn(6, generator=gen, dtype=torch.float64) * 3
        jac = torch.autograd.functional.jacobian(lambda x: x.softmax(-1), s)
        assert float(softmax_jacobian_norm(s.softmax(-1))) == pytest.approx(float(jac.norm()), abs=1e-10)


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_heads=()), "d_heads"), (dict(d_heads=(8, 0)), "d_heads"), (dict(d_heads=(8.0,)), "d_heads"),
    (dict(scaled=(1,)), "scaled"), (dict(seeds=(-1,)), "seeds"), (dict(n_pos=1), "n_pos"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        saturation_sweep(**kwargs)


def test_slope_arguments(sweep):
    with pytest.raises(ValueError, match="column"):
        loglog_slope(sweep, "seed", True)
    with pytest.raises(ValueError, match="two d_head"):
        loglog_slope(sweep[sweep.d_head == 8], "score_var", True)
