"""Bad probe options and loss masks: a ValueError/TypeError naming the value, raised before any forward pass.

Bad tokens and attention masks are in tests/test_model_inputs.py's table, which runs each through
every probe and both adapters with the one wording of harness.model.inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

import probes
from harness import ModelConfig, Transformer

PROBES = {
    "head_importance": probes.head_importance,
    "prune_curve": probes.prune_curve,
    "redundancy": probes.redundancy,
    "head_similarity": probes.head_similarity,
    "head_roles": probes.head_roles,
    "attention_entropy": probes.attention_entropy,
}
LOSS_PROBES = ("head_importance", "prune_curve", "redundancy")


@pytest.fixture(scope="module")
def model():
    m = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=10, n_ctx=8)).eval()
    m.calls = 0

    def count(module, args):
        module.calls += 1
    m.register_forward_pre_hook(count)
    return m


GOOD = torch.randint(0, 10, (3, 6), generator=torch.Generator().manual_seed(0))


def expect(call, error, needle, model):
    before = model.calls
    with pytest.raises(error) as info:
        call()
    assert needle in str(info.value), f"{needle!r} not in {info.value!s}"
    assert model.calls == before, "the error came after a forward pass"


@pytest.mark.parametrize("name", LOSS_PROBES)
@pytest.mark.parametrize("mask, needle", [
    (torch.ones(3, 5, dtype=torch.bool), "loss_mask has shape (3, 5): expected [batch, pos] = (3, 6)"),
    (torch.ones(6, dtype=torch.bool), "loss_mask has shape (6,)"),
    (torch.ones(3, 6), "loss_mask has dtype torch.float32"),
    (torch.full((3, 6), 2), "loss_mask holds the value 2: expected only 0 and 1"),
    (torch.zeros(3, 6, dtype=torch.bool), "selects no target"),
    ([[1] * 6] * 3, "loss_mask must be a torch.Tensor [batch, pos] = (3, 6), got list"),
])
def test_bad_loss_mask(model, name, mask, needle):
    error = TypeError if isinstance(mask, list) else ValueError
    expect(lambda: PROBES[name](model, GOOD, loss_mask=mask), error, needle, model)


@pytest.mark.parametrize("call, needle", [
    (lambda m: probes.head_importance(m, GOOD, method="pruning"), "method='pruning'"),
    (lambda m: probes.head_importance(m, GOOD, method=None), "method=None"),
    (lambda m: probes.head_importance(m, GOOD, normalize="yes"), "normalize='yes'"),
    (lambda m: probes.prune_curve(m, GOOD, method="grad"), "method='grad'"),
    (lambda m: probes.prune_curve(m, GOOD, order="importances"), "order='importances'"),
    (lambda m: probes.prune_curve(m, GOOD, order=("random", "best")), "order='best'"),
    (lambda m: probes.prune_curve(m, GOOD, order=()), "order=()"),
    (lambda m: probes.prune_curve(m, GOOD, fractions=[0.5, 1.5]), "1.5"),
    (lambda m: probes.prune_curve(m, GOOD, fractions=[-0.1]), "-0.1"),
    (lambda m: probes.prune_curve(m, GOOD, fractions=[math.nan]), "nan"),
    (lambda m: probes.prune_curve(m, GOOD, fractions=[]), "fractions=()"),
    (lambda m: probes.prune_curve(m, GOOD, fractions="0.5"), "fractions='0.5'"),
    (lambda m: probes.prune_curve(m, GOOD, order="random", seeds=(0, -1)), "-1"),
    (lambda m: probes.prune_curve(m, GOOD, order="random", seeds=()), "seeds=()"),
    (lambda m: probes.prune_curve(m, GOOD, reestimate=1), "reestimate=1"),
    (lambda m: probes.redundancy(m, GOOD, tolerance=0), "tolerance=0"),
    (lambda m: probes.redundancy(m, GOOD, tolerance=1), "tolerance=1"),
    (lambda m: probes.redundancy(m, GOOD, tolerance=-0.01), "tolerance=-0.01"),
    (lambda m: probes.redundancy(m, GOOD, tolerance=1.5), "tolerance=1.5"),
    (lambda m: probes.redundancy(m, GOOD, tolerance=math.nan), "tolerance=nan"),
    (lambda m: probes.redundancy(m, GOOD, tolerance="0.01"), "tolerance='0.01'"),
    (lambda m: probes.redundancy(m, GOOD, tolerance=True), "tolerance=True"),
    (lambda m: probes.redundancy(m, GOOD, method="mean"), "method='mean'"),
    (lambda m: probes.redundancy(m, GOOD, criterion="acc"), "criterion='acc'"),
    (lambda m: probes.head_similarity(m, GOOD, metric="cka"), "metric='cka'"),
    (lambda m: probes.attention_entropy(m, GOOD, threshold=0), "threshold=0"),
    (lambda m: probes.attention_entropy(m, GOOD, threshold=1.1), "threshold=1.1"),
    (lambda m: probes.head_roles(m, GOOD, batch_size=0), "batch_size=0"),
    (lambda m: probes.head_importance(m, GOOD, batch_size=2.5), "batch_size=2.5"),
    (lambda m: probes.head_importance(m, GOOD, batch_size=True), "batch_size=True"),
])
def test_bad_options(model, call, needle):
    expect(lambda: call(model), ValueError, needle, model)


def test_loss_probes_need_two_positions(model):
    expect(lambda: probes.head_importance(model, GOOD[:, :1]), ValueError, "at least 1 sequence and 2 position(s)",
           model)


def test_not_a_model(model):
    for thing in (None, torch.nn.Linear(2, 2), "gpt2"):
        with pytest.raises(TypeError, match="model"):
            probes.head_importance(thing, GOOD)
