"""What each property row costs: passes of the model and of its float64 copies, and seconds.

The counts are exact (they are calls, not timings), so they are asserted; seconds only as positive.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tr

from harness import ModelConfig, Transformer
from harness.adapters import adapt
from harness.errors import AttnlabError
from properties import check_model
from properties.cost import COST_COLUMNS, counting
from properties.precision import golden_twin
from properties.suite import COLUMNS

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    shape = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_vocab": 32, "n_ctx": 16, **kw}
    return Transformer(ModelConfig(**shape)).eval()


def test_counting_tells_the_model_from_its_copies():
    model = tiny()
    twin = golden_twin(model)
    x = torch.tensor([[1, 2, 3]])
    with counting(model) as cost:
        for _ in range(3):
            model(x)
        twin(x)
    assert (cost.model_passes, cost.twin_passes) == (3, 1) and cost.seconds > 0
    with counting(model) as after:  # the hooks are gone once the block ends: nothing counted outside it
        pass
    model(x)
    assert (after.model_passes, after.twin_passes) == (0, 0)


def test_an_adapter_around_a_protocol_model_counts_one_pass_per_call():
    hf = tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=32, n_positions=16, n_embd=32, n_layer=2, n_head=4)).eval()
    adapter = adapt(hf)
    with counting(adapter) as cost:
        adapter(torch.tensor([[1, 2]]))
    assert (cost.model_passes, cost.twin_passes) == (1, 0)


def test_every_row_says_what_it_cost():
    table = check_model(tiny(positional_embedding_type="rotary"), max_examples=4).set_index("property")
    assert list(table.reset_index().columns) == COLUMNS and COLUMNS[-3:] == COST_COLUMNS
    ran = table[table["status"].isin(["pass", "fail"])]
    assert (ran["model_passes"] > 0).all() and (ran["seconds"] > 0).all(), ran[COST_COLUMNS]
    skipped = table[table["status"] == "n/a"]
    assert not skipped.empty and (skipped["model_passes"] == 0).all() and (skipped["twin_passes"] == 0).all()
    assert table.loc["padding_outputs", "twin_passes"] > 0  # calibrated: each pass also runs on the twin
    assert table.loc["causal_pattern", "twin_passes"] == 0  # exact: no twin


def test_the_suite_runs_on_its_own_threads_and_restores_the_callers():
    seen = []

    def watch(module, args):
        seen.append(torch.get_num_threads())

    model = tiny()
    torch.set_num_threads(2)
    try:
        handle = model.register_forward_pre_hook(watch)
        check_model(model, properties=["causal_pattern"], max_examples=2)
        handle.remove()
        assert set(seen) == {1} and torch.get_num_threads() == 2  # THREADS while it runs, the caller's after
        with pytest.raises(AttnlabError, match="threads=0"):
            check_model(model, properties=["causal_pattern"], threads=0)
    finally:
        torch.set_num_threads(1)


def test_a_large_linear_op_runs_on_the_callers_threads_and_the_rest_on_one(monkeypatch):
    """The threshold lowered to one row of a 65536-token vocabulary's unembedding (the real one, 2^28, would need a
    4M-token vocabulary here): the unembedding runs on the caller's 2 threads, its float64 twin's too; every other
    module (layers 32 wide, their largest product 2 x 32 rows x 32 x 128 = 2^18) on the suite's 1."""
    from properties import threads

    model = tiny(d_vocab=65536)
    monkeypatch.setattr(threads, "WIDE_FLOPS", 2 * 32 * 65536)
    twin = golden_twin(model)  # the one the check will use (cached while the weights are unchanged)
    seen: dict[tuple[str, str], set[int]] = {}

    def watcher(which):
        def watch(module, args):  # a module's own hook runs after the suite's global one: it sees its choice
            kind = "unembed" if module is which.unembed else "other"
            seen.setdefault((kind, "twin" if which is twin else "model"), set()).add(torch.get_num_threads())
        return watch

    handles = [m.register_forward_pre_hook(watcher(which)) for which in (model, twin) for m in which.modules()]
    torch.set_num_threads(2)
    try:
        check_model(model, properties=["causal_outputs"], max_examples=3)
        assert seen == {(kind, who): {1 if kind == "other" else 2} for kind in ("unembed", "other")
                        for who in ("model", "twin")}, seen
        assert torch.get_num_threads() == 2
        seen.clear()
        with torch.no_grad():  # outside the suite nothing is switched
            model(torch.tensor([[1, 2]]))
        assert seen[("other", "model")] == {2}
    finally:
        for handle in handles:
            handle.remove()
        torch.set_num_threads(1)
