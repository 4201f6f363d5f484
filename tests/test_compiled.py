"""harness.model.compiled.HookAwareCompiled, alone and inside ``train(compile=True)``.

TorchDynamo traces a model once and does not guard on hooks (``skip_nnmodule_hook_guards``), so a
hook added to a HookPoint after the first compiled call never fires through a bare
``torch.compile``. The wrapper runs the compiled graph only while no hook point has a hook.

Every test compiles with a counting TorchDynamo backend that runs the traced graph as it is (no
code generation, so a compile costs about a second) and records each call, so a test can tell
which path a forward pass took: the compiled graph or the eager model.
"""

from __future__ import annotations

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from harness import ModelConfig, TrainConfig, Transformer, train
from harness.model.compiled import HookAwareCompiled
from harness.training import loop

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = ModelConfig(n_layers=1, d_model=32, n_heads=2, d_vocab=16, n_ctx=16)
# eval_every past the end: one evaluation, at the last step (eval_batches=1: one forward pass).
CFG = TrainConfig(seq_len=16, batch_size=4, steps=3, warmup=1, eval_every=100, log_every=1, eval_batches=1,
                  checkpoint_every=None, compile=True)
HOOK = "blocks.0.hook_resid_post"


@pytest.fixture
def graph_calls():
    """A list that grows by one each time a compiled graph runs, and the backend that appends to it."""
    calls: list[int] = []

    def counting_backend(gm, example_inputs):
        def run(*args):
            calls.append(1)
            return gm.forward(*args)
        return run

    torch._dynamo.reset()  # a fresh cache: a graph traced by another test must not be reused
    yield calls, counting_backend
    torch._dynamo.reset()


def test_compiled_graph_runs_only_while_unhooked(graph_calls):
    calls, backend = graph_calls
    model = Transformer(MODEL).eval()
    tokens = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(2))
    wrapped = HookAwareCompiled(model, backend=backend)
    assert "_compiled" not in dict(wrapped.named_modules())  # parameters are listed once
    with torch.no_grad():
        ref = model(tokens)
        torch.testing.assert_close(wrapped(tokens), ref, rtol=0, atol=0)
        assert calls, "the unhooked call did not go through the compiled graph"
        n, seen = len(calls), []
        with model.hooks(fwd_hooks=[(HOOK, lambda x, hook: seen.append(x.shape))]):
            wrapped(tokens)
        assert seen == [torch.Size([2, 8, 32])] and len(calls) == n  # eager: the hook fired, no graph ran
        torch.testing.assert_close(wrapped(tokens), ref, rtol=0, atol=0)
        assert len(calls) == 2 * n  # the hook is gone: back on the compiled graph(s) (n per forward pass)


def test_a_model_without_hook_points_is_refused():
    with pytest.raises(TypeError, match="HookedRootModule"):
        HookAwareCompiled(torch.nn.Linear(2, 2))


def _train_adding_a_hook_after_step_1(model: Transformer, run_dir, calls: list[int]) -> tuple[int, int]:
    """Train CFG; after the first optimizer step, add a counting hook to ``model`` (as a user probing a
    run in progress would). Returns (forward passes the hook saw, compiled-graph calls by then)."""
    fired: list[int] = []
    added: list[int] = []

    def after_step(optimizer, args, kwargs):
        if not added:
            added.append(len(calls))
            model.add_hook(HOOK, lambda x, hook: fired.append(1))

    handle = register_optimizer_step_post_hook(after_step)
    try:
        train(model, CFG, run_dir, progress=False)
    finally:
        handle.remove()
        model.reset_hooks()
    assert len(added) == 1, "the optimizer step hook did not run"
    return len(fired), added[0]


def test_a_hook_added_after_the_first_compiled_step_fires_in_training(graph_calls, monkeypatch, tmp_path):
    calls, backend = graph_calls
    wrapped: list[HookAwareCompiled] = []

    def compiled_with_counting_backend(model):
        wrapped.append(HookAwareCompiled(model, backend=backend))
        return wrapped[-1]

    monkeypatch.setattr(loop, "HookAwareCompiled", compiled_with_counting_backend)
    fired, at_step_1 = _train_adding_a_hook_after_step_1(Transformer(MODEL), tmp_path, calls)
    assert len(wrapped) == 1 and at_step_1 > 0, "step 1 did not run the compiled graph"
    assert len(calls) == at_step_1, "a compiled graph ran while the hook was attached"
    assert fired == CFG.steps - 1 + CFG.eval_batches  # steps 2 and 3, and the final evaluation


def test_without_the_wrapper_the_same_hook_is_silently_skipped(graph_calls, monkeypatch, tmp_path):
    # What HookAwareCompiled fixes: train's forward through a bare torch.compile, as it used to be.
    calls, backend = graph_calls
    monkeypatch.setattr(loop, "HookAwareCompiled", lambda model: torch.compile(model, backend=backend))
    fired, at_step_1 = _train_adding_a_hook_after_step_1(Transformer(MODEL), tmp_path, calls)
    assert at_step_1 > 0 and len(calls) > at_step_1  # steps 2 and 3 ran the graph traced before the hook
    # Neither training step ran the hook (the wrapper's run sees CFG.steps - 1 + CFG.eval_batches); only the
    # evaluation can, since eval mode fails Dynamo's guard on `training` and is traced afresh, hook included.
    assert fired <= CFG.eval_batches
