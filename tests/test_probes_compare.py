"""probes.compare_estimators and its rank correlations, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

import probes
from harness import ModelConfig, Transformer
from probes.compare import ESTIMATOR_COLUMNS, ESTIMATORS, average_ranks, kendall_tau_b, spearman
from tests.helpers.one_head_model import constant_tokens, constructed_model

pytestmark = pytest.mark.usefixtures("one_thread")


def t(values):
    return torch.tensor(values, dtype=torch.float64)


def test_rank_correlations_with_ties_match_a_hand_computation():
    x, y = t([1, 2, 2, 3]), t([1, 3, 2, 2])
    # average ranks: x -> 1, 2.5, 2.5, 4; y -> 1, 4, 2.5, 2.5; centred: (-1.5, 0, 0, 1.5), (-1.5, 1.5, 0, 0)
    assert average_ranks(x).tolist() == [1, 2.5, 2.5, 4]
    assert spearman(x, y) == pytest.approx(2.25 / 4.5)
    # pairs: (0,1) (0,2) (0,3) concordant, (1,3) discordant, (1,2) tied in x, (2,3) tied in y:
    # tau_b = (3 - 1) / sqrt((6 - 1) (6 - 1)) = 0.4
    assert kendall_tau_b(x, y) == pytest.approx(0.4)


def test_rank_correlations_without_ties_match_the_textbook_formulas():
    x, y = t([1, 2, 3, 4, 5]), t([2, 1, 4, 3, 5])
    # rho = 1 - 6 sum d^2 / (n (n^2 - 1)) = 1 - 24 / 120; tau = (8 - 2) / 10
    assert spearman(x, y) == pytest.approx(0.8)
    assert kendall_tau_b(x, y) == pytest.approx(0.6)
    assert spearman(x, -x) == pytest.approx(-1) and kendall_tau_b(x, -x) == pytest.approx(-1)
    assert math.isnan(spearman(x, t([3] * 5))) and math.isnan(kendall_tau_b(x, t([3] * 5)))


def tiny():
    model = Transformer(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=16, n_ctx=16, seed=0)).eval()
    tokens = torch.randint(0, 16, (8, 16), generator=torch.Generator().manual_seed(0))
    return model, tokens


def test_table_shape_ablation_is_exact_and_passes_are_counted():
    model, tokens = tiny()
    fast = probes.L0Options(steps=3, rows=4)
    df = probes.compare_estimators(model, tokens, budgets=(0.01, 0.5), l0_options=fast)
    assert tuple(df.columns) == ESTIMATOR_COLUMNS
    assert list(df["method"].unique()) == list(ESTIMATORS) and len(df) == 2 * len(ESTIMATORS)
    by = df.drop_duplicates("method").set_index("method")
    assert by.loc["ablation", "spearman"] == 1 and by.loc["ablation", "kendall"] == 1
    # prefix reuse: the base pass + 4 masks from layer 0 (whole model) + 4 from layer 1 (half of it)
    assert by.loc["ablation", "forward_passes"] == pytest.approx(1 + 4 + 4 * 0.5)
    assert (by.loc["gradient", "forward_passes"], by.loc["gradient", "backward_passes"]) == (1, 1)
    assert by.loc["l0_gates", "forward_passes"] == pytest.approx(3 * 4 / 8)  # 3 steps of 4 of 8 sequences
    assert by.loc["l0_gates", "backward_passes"] == pytest.approx(3 * 4 / 8)
    assert by.loc["mean_ablation", "forward_passes"] == pytest.approx(1 + 7)  # the means, then leave-one-out
    assert (df["seconds"] >= 0).all() and df[["spearman", "kendall"]].abs().le(1 + 1e-12).all().all()
    for _, part in df.groupby("method"):  # a larger budget never prunes fewer heads
        assert part.sort_values("budget")["prunable_fraction"].is_monotonic_increasing


def test_prunable_fraction_matches_a_prune_curve_of_the_same_order():
    model, tokens = tiny()
    df = probes.compare_estimators(model, tokens, methods=("gradient",), budgets=(0.02,))
    curve = probes.prune_curve(model, tokens, order="importance", method="gradient",
                               fractions=[i / 8 for i in range(9)])
    base = float(curve.loc[curve.n_pruned == 0, "loss"].iloc[0])
    over = curve.sort_values("n_pruned")["loss"].gt(base * 1.02).tolist()
    expected = (over.index(True) - 1 if True in over else 8) / 8
    assert float(df["prunable_fraction"].iloc[0]) == pytest.approx(expected)


def test_on_the_constructed_model_every_informed_estimator_finds_the_crucial_head():
    model, tokens = constructed_model(), constant_tokens()
    df = probes.compare_estimators(model, tokens, methods=("ablation", "gradient", "l0_gates"), budgets=(0.01,),
                                   l0_options=probes.L0Options(penalty=0.05, steps=100, rows=8))
    by = df.set_index("method")
    # exact: head 1 is worth ~log 8 nats, the rest exactly 0 (three tied); pruning the three is free
    assert by.loc["ablation", "prunable_fraction"] == 0.75
    for method in ("gradient", "l0_gates"):
        assert by.loc[method, "prunable_fraction"] == 0.75, method
        assert by.loc[method, "spearman"] > 0.7, method


def test_deterministic_under_a_seed():
    model, tokens = tiny()
    cols = ["method", "spearman", "kendall", "budget", "prunable_fraction"]
    a = probes.compare_estimators(model, tokens, methods=("random", "l0_gates"), seed=3,
                                  l0_options=probes.L0Options(steps=3, seed=3))[cols]
    b = probes.compare_estimators(model, tokens, methods=("random", "l0_gates"), seed=3,
                                  l0_options=probes.L0Options(steps=3, seed=3))[cols]
    assert a.equals(b)


@pytest.mark.parametrize("kwargs, needle", [
    ({"methods": ()}, "methods"), ({"methods": ("exact",)}, "methods"), ({"methods": 3}, "methods"),
    ({"budgets": ()}, "budgets"), ({"budgets": (0.0,)}, "budget"), ({"budgets": (float("nan"),)}, "budget"),
    ({"budgets": "0.1"}, "budgets"), ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"),
    ({"batch_size": 0}, "batch_size"),
])
def test_bad_arguments_are_refused(kwargs, needle):
    model, tokens = tiny()
    with pytest.raises(ValueError, match=needle):
        probes.compare_estimators(model, tokens, **kwargs)
