"""Learned L0 gates (``method="l0_gates"``, Voita et al. 2019): the penalty formula, a constructed
model with one useless and one crucial head, determinism, and bad arguments."""

from __future__ import annotations

import math

import pytest
import torch

import probes
from probes.l0_gates import BETA, GAMMA, ZETA, L0Options, l0_penalty, sample_gates
from tests.helpers.one_head_model import constant_tokens, constructed_model


def test_l0_penalty_matches_the_closed_form_and_sampling():
    # P(z != 0) = P(s_bar > 0) = P(s > t), t = -gamma / (zeta - gamma); with s = sigmoid((l + log_alpha) / beta)
    # and l standard logistic, s > t  <=>  l > beta * logit(t) - log_alpha, so P = 1 - F(beta logit(t) - log_alpha)
    # for the logistic CDF F (Louizos et al. 2018, eq. 12, derived independently here).
    log_alpha = torch.tensor([[-4.0, -1.0, 0.0], [0.5, 2.0, 6.0]], dtype=torch.float64)
    t = -GAMMA / (ZETA - GAMMA)
    logit_t = math.log(t / (1 - t))
    logistic_cdf = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    expected = torch.tensor([[1 - logistic_cdf(BETA * logit_t - a) for a in row] for row in log_alpha.tolist()],
                            dtype=torch.float64)
    torch.testing.assert_close(l0_penalty(log_alpha), expected, atol=1e-12, rtol=0)  # float64 round-off only
    # and the sampler agrees: the fraction of 200k samples above 0 is within 4 standard errors
    n = 200_000
    u = torch.rand(n, 2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    z = sample_gates(log_alpha, u)
    assert float(z.min()) >= 0 and float(z.max()) <= 1
    freq = (z > 0).double().mean(0)
    se = (expected * (1 - expected) / n).sqrt()
    assert bool(((freq - expected).abs() <= 4 * se + 1e-9).all()), (freq, expected)


def test_gates_close_on_the_useless_head_and_stay_open_on_the_crucial_one(one_thread):
    model, tokens = constructed_model(), constant_tokens()
    exact = probes.head_importance(model, tokens, method="ablation").set_index("head")["loss_delta"]
    assert exact[1] > 1.0 and abs(exact[0]) < 1e-6  # the construction does what it claims
    frame = probes.head_importance(model, tokens, method="l0_gates",
                                   l0_options=L0Options(penalty=0.05, steps=150, lr=0.1, rows=8))
    p = frame.set_index("head")["importance"]
    assert p[0] < 0.05, p  # useless: the penalty shuts it
    assert p[1] > 0.95, p  # crucial: the task loss holds it open
    assert frame["loss_delta"].isna().all()
    assert frame.attrs["expected_open_gates"] < 1.5  # heads 0, 2, 3 all shut


def test_l0_gates_are_deterministic_under_a_seed(one_thread):
    model, tokens = constructed_model(), constant_tokens()
    opts = L0Options(steps=20, seed=5)
    a = probes.head_importance(model, tokens, method="l0_gates", l0_options=opts)
    b = probes.head_importance(model, tokens, method="l0_gates", l0_options=opts)
    c = probes.head_importance(model, tokens, method="l0_gates", l0_options=L0Options(steps=20, seed=6))
    assert a["importance"].tolist() == b["importance"].tolist()
    assert a["importance"].tolist() != c["importance"].tolist()


def test_l0_gates_in_a_prune_curve(one_thread):
    model, tokens = constructed_model(), constant_tokens()
    curve = probes.prune_curve(model, tokens, order="importance", method="l0_gates", fractions=(0, 0.75, 1))
    # l0 order prunes the three useless heads first: loss unchanged at 75% pruned
    loss = curve.set_index("n_pruned")["loss"]
    assert loss[3] == pytest.approx(loss[0], abs=1e-6) and loss[4] > loss[0] + 1.0


@pytest.mark.parametrize("field, value", [
    ("penalty", -0.1), ("penalty", float("nan")), ("steps", 0), ("steps", 2.5), ("lr", 0.0), ("lr", True),
    ("rows", 0), ("init", float("inf")), ("seed", -1), ("seed", "a"),
])
def test_bad_l0_options_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        L0Options(**{field: value})


def test_l0_options_of_the_wrong_type_are_refused_before_any_work():
    model, tokens = constructed_model(), constant_tokens()
    with pytest.raises(TypeError, match="l0_options"):
        probes.head_importance(model, tokens, method="l0_gates", l0_options={"steps": 3})
