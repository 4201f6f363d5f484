"""The probes on a model trained on the ``induction`` task (harness.train).

Two layers of eight attention-only heads learn the induction circuit of Olsson et al. (2022): a
previous-token head in layer 0 whose output the induction heads of layer 1 read. Strong weight
decay lets the heads the circuit does not use fade, so the model has heads to spare, which is what
redundancy must find. ``pytest -s`` prints the tables of the closing note.
"""

from __future__ import annotations

import pytest
import torch

import harness
import probes
from harness import ModelConfig, TrainConfig
from harness.training.tasks import make_task

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

MODEL = ModelConfig(n_layers=2, d_model=64, n_heads=8, attn_only=True, d_vocab=64, n_ctx=64)
TRAIN = TrainConfig(task="induction", seq_len=64, batch_size=32, steps=500, lr=3e-3, warmup=50,
                    weight_decay=1.0, eval_every=500, log_every=50, checkpoint_every=None, seed=0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    run_dir = tmp_path_factory.mktemp("induction_run")
    metrics = harness.train(MODEL, TRAIN, run_dir, progress=False)
    accuracy = float(metrics.val_accuracy.dropna().iloc[-1])
    if accuracy < 0.95:  # the probes' claims below are about a model that solved the task
        pytest.fail(f"the induction model reached only {accuracy:.3f} validation accuracy; expected >= 0.95")
    model = harness.load_run(run_dir)
    task = make_task(TRAIN.task, MODEL.d_vocab, MODEL.n_ctx, TRAIN.seq_len, TRAIN.task_options)
    tokens, loss_mask = task.batch(64, torch.Generator().manual_seed(1234), "val")
    return model, tokens, loss_mask


@pytest.fixture(scope="module")
def roles(trained):
    model, tokens, _ = trained
    return probes.head_roles(model, tokens)


def uniform_previous_token(pos: int) -> float:
    """The previous-token score of a head that attends uniformly to the causal past: mean of 1/(q+1)."""
    return sum(1 / (q + 1) for q in range(1, pos)) / (pos - 1)


def test_roles_find_the_induction_circuit(trained, roles):
    _, tokens, _ = trained
    print("\nhead roles\n" + roles.round(3).to_string(index=False))
    induction = roles[roles.induction > 0.5]
    assert len(induction) >= 1 and (induction.layer == 1).all()  # induction heads need a layer before them
    prev = roles.loc[roles.previous_token.idxmax()]
    assert prev.layer == 0  # the previous-token head sits under the induction heads it feeds
    assert prev.previous_token > 0.3 and prev.previous_token > 4 * uniform_previous_token(tokens.shape[1])


def test_importance_ranks_the_circuit_first(trained, roles):
    model, tokens, loss_mask = trained
    ablation = probes.head_importance(model, tokens, loss_mask=loss_mask)
    gradient = probes.head_importance(model, tokens, loss_mask=loss_mask, method="gradient")
    table = ablation.assign(gradient=gradient.importance, induction=roles.induction,
                            previous_token=roles.previous_token).sort_values("importance", ascending=False)
    print("\nimportance ranking (ablation loss_delta, gradient E|dL/dxi|)\n" + table.round(4).to_string(index=False))
    top = table.iloc[0]
    prev = roles.loc[roles.previous_token.idxmax()]
    assert (top.layer, top["head"]) == (prev.layer, prev["head"])  # removing the previous-token head breaks it all
    assert gradient.loc[gradient.importance.idxmax(), ["layer", "head"]].tolist() == [prev.layer, prev["head"]]
    layer1 = table[table.layer == 1]
    assert layer1.iloc[0].induction > 0.5  # the most important layer-1 head is an induction head


def test_pruning_beats_random_order(trained):
    model, tokens, loss_mask = trained
    fractions = [i / 16 for i in range(17)]
    curve = probes.prune_curve(model, tokens, loss_mask=loss_mask, order=("importance", "random"),
                               fractions=fractions)
    table = curve.pivot_table(index="n_pruned", columns="order", values=["loss", "accuracy"])
    print("\nprune curve, importance order vs random (mean of 3 seeds)\n" + table.round(4).to_string())
    imp = curve[curve.order == "importance"].groupby("n_pruned").loss.mean()
    rnd = curve[curve.order == "random"].groupby("n_pruned").loss.mean()
    assert imp.iloc[0] == rnd.iloc[0] and imp.iloc[-1] == pytest.approx(rnd.iloc[-1])  # same ends
    assert (imp.iloc[1:15] < rnd.iloc[1:15]).all()  # every partial pruning costs less in importance order

    headline = probes.redundancy(model, tokens, loss_mask=loss_mask, tolerance=0.01)
    seeds = range(10)  # ten random orders: their mean prunable fraction is the baseline to beat
    by_acc = probes.redundancy(model, tokens, loss_mask=loss_mask, tolerance=0.02, criterion="accuracy", seeds=seeds)
    by_loss = probes.redundancy(model, tokens, loss_mask=loss_mask, tolerance=0.5, method="ablation", seeds=seeds)
    for name, red in (("loss +1%", headline), ("accuracy -2 points", by_acc), ("loss +50%, ablation order", by_loss)):
        print(f"\nredundancy, {name}\n" + red.to_string())
    # The model solves the task, so its loss is near 0 and a 1% budget is below what even the weakest
    # head adds: nothing is prunable in either order there. With room to spend, the importance order
    # prunes at least twice as many heads as a random order does on average.
    assert headline.prunable_fraction >= headline.random_prunable_fraction
    assert by_acc.prunable_fraction >= 2 * by_acc.random_prunable_fraction > 0
    assert by_loss.prunable_fraction >= 2 * by_loss.random_prunable_fraction > 0
