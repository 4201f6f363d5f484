"""Prune, then heal: head masks held at zero, the distillation loss, exact resume, bad inputs."""

import copy

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from harness import ModelConfig, TrainConfig, Transformer, load_run, train
from harness.model.head_mask import apply_head_mask, head_mask_of
from harness.training.distill import mixed_loss, soft_kl
from harness.training.tasks import make_task, shifted

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = ModelConfig(n_layers=2, d_model=32, n_heads=2, d_vocab=16, n_ctx=16, use_attn_result=True)
CFG = TrainConfig(seq_len=16, batch_size=8, steps=6, warmup=2, eval_every=3, log_every=1, eval_batches=2,
                  checkpoint_every=3, device="cpu")
MASK = ((1, 0), (0, 1))  # prune head 1 of layer 0 and head 0 of layer 1
EXACT = ["step", "lr", "train_loss", "val_loss", "val_accuracy", "grad_norm"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    run = tmp_path_factory.mktemp("teacher")
    train(MODEL, CFG.replace(steps=20, checkpoint_every=None, eval_every=20, log_every=20), run, progress=False)
    return run


def test_soft_kl_is_t_squared_kl_of_softened_distributions():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(50, 11, generator=g, dtype=torch.float64) * 3, torch.randn(50, 11, generator=g,
                                                                                   dtype=torch.float64) * 3
    for temp in (1.0, 2.5):
        # independent: torch's kl_div(input=log q, target=log p, log_target) = sum p (log p - log q)
        ref = F.kl_div(F.log_softmax(s / temp, -1), F.log_softmax(t / temp, -1), reduction="none",
                       log_target=True).sum(-1) * temp ** 2
        torch.testing.assert_close(soft_kl(s, t, temp), ref, rtol=1e-12, atol=1e-12)
    hard = torch.rand(50, dtype=torch.float64)
    target = torch.zeros(50, dtype=torch.long)
    assert torch.equal(mixed_loss(s, t, target, hard, 3.0, 0.0), hard)  # alpha 0: the labels alone
    mix = mixed_loss(s, t, target, hard, 3.0, 0.25)
    torch.testing.assert_close(mix, 0.25 * soft_kl(s, t, 3.0) + 0.75 * hard)


def test_loss_at_t1_alpha1_is_kl_teacher_student(teacher, tmp_path):
    """Step 1's training loss equals KL(teacher || student) on step 1's batch, recomputed in float64."""
    student = Transformer(MODEL.replace(seed=7))
    before = copy.deepcopy(student)
    apply_head_mask(before, MASK)
    df = train(student, CFG.replace(steps=1), tmp_path, progress=False, head_mask=MASK, distill_from=str(teacher),
               temperature=1.0, alpha=1.0)
    task = make_task(CFG.task, MODEL.d_vocab, MODEL.n_ctx, CFG.seq_len, CFG.task_options)
    tokens, mask = task.batch(CFG.batch_size, torch.Generator().manual_seed(CFG.seed))  # the loop's first draw
    with torch.no_grad():
        s, target = shifted(before.double().eval()(tokens), tokens, mask)
        t, _ = shifted(load_run(teacher).double()(tokens), tokens, mask)
    kl = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), reduction="batchmean", log_target=True)
    err = abs(float(df["train_loss"].iloc[0]) - float(kl))
    print(f"|train_loss(T=1, alpha=1) - KL(teacher||student) float64| = {err:.3g}")
    # the loop computes in float32: a mean of ~100 per-token KLs of order 1, ~1e-7 relative each
    assert err < 1e-5 * max(1.0, float(kl)), (float(df["train_loss"].iloc[0]), float(kl))


def test_pruned_heads_stay_exactly_zero_through_training(teacher, tmp_path):
    student = load_run(teacher).train()
    seen = []

    def record(result, hook):  # hook_result is computed from the masked hook_z: an independent witness
        seen.append((result[:, :, 1].abs().max().item(), result[:, :, 0].abs().max().item()))

    student.blocks[0].attn.hook_result.add_hook(record, dir="fwd")
    train(student, CFG, tmp_path, progress=False, head_mask=MASK, distill_from=str(teacher))
    assert len(seen) > CFG.steps and all(pruned == 0.0 and kept > 0 for pruned, kept in seen), seen[:3]
    healed = load_run(tmp_path)
    assert head_mask_of(healed) == MASK
    z = {}
    tokens = torch.randint(0, MODEL.d_vocab, (3, 16), generator=torch.Generator().manual_seed(1))
    healed.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{l}.attn.hook_z", lambda t, hook: z.update({hook.name: t}))
                                             for l in range(2)])
    assert torch.all(z["blocks.0.attn.hook_z"][:, :, 1] == 0) and torch.all(z["blocks.1.attn.hook_z"][:, :, 0] == 0)
    assert z["blocks.0.attn.hook_z"][:, :, 0].abs().max() > 0


@pytest.mark.parametrize("with_teacher", [True, False], ids=["distilled", "fine-tuned"])
def test_heal_then_resume_is_bit_identical(teacher, tmp_path, with_teacher):
    kw = dict(head_mask=MASK, distill_from=str(teacher) if with_teacher else None)
    straight = train(load_run(teacher).train(), CFG, tmp_path / "straight", progress=False, **kw)
    train(load_run(teacher).train(), CFG, tmp_path / "split", progress=False, stop_after=4, **kw)
    rest = train(load_run(teacher).train(), CFG, tmp_path / "split", progress=False, resume=True, **kw)
    pd.testing.assert_frame_equal(straight[EXACT], rest[EXACT], check_exact=True)
    a, b = load_run(tmp_path / "straight").state_dict(), load_run(tmp_path / "split").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    if with_teacher:  # the distillation loss is not the plain one
        plain = train(load_run(teacher).train(), CFG, tmp_path / "plain", progress=False, head_mask=MASK)
        assert not straight["train_loss"].equals(plain["train_loss"])


@pytest.mark.parametrize(("kw", "match"), [
    ({"head_mask": [[1, 1, 1], [1, 1, 1]]}, r"head_mask=.* of shape \[2, 3\].*\[2, 2\]"),
    ({"head_mask": [[0, 0], [0, 0]]}, r"head_mask=.*every head is pruned"),
    ({"head_mask": [[1, 0.5], [1, 1]]}, r"head_mask=.*0 \(pruned\) and 1"),
    ({"temperature": 0.0, "distill_from": "TEACHER"}, r"temperature=0\.0"),
    ({"temperature": -1.0, "distill_from": "TEACHER"}, r"temperature=-1\.0"),
    ({"alpha": 1.5, "distill_from": "TEACHER"}, r"alpha=1\.5"),
    ({"alpha": -0.1, "distill_from": "TEACHER"}, r"alpha=-0\.1"),
    ({"alpha": 1.0}, r"alpha=1\.0 is invalid without a teacher"),
    ({"distill_from": "MISSING"}, r"distill_from=.*missing.*expected a run directory"),
])
def test_bad_inputs_raise_one_error_before_any_work(teacher, tmp_path, kw, match):
    kw = {k: (str(teacher) if v == "TEACHER" else str(tmp_path / "missing") if v == "MISSING" else v)
          for k, v in kw.items()}
    with pytest.raises(ValueError, match=match):
        train(MODEL, CFG, tmp_path / "run", progress=False, **kw)
    assert not (tmp_path / "run").exists()  # nothing was written


@pytest.mark.parametrize("field", ["d_vocab", "n_ctx"])
def test_a_teacher_of_another_vocabulary_or_context_is_refused(teacher, tmp_path, field):
    other = MODEL.replace(**{field: 32})
    with pytest.raises(ValueError, match=rf"teacher's {field}=16 differs from the student's {field}=32"):
        train(other, CFG, tmp_path / "run", progress=False, distill_from=str(teacher))
    assert not (tmp_path / "run").exists()
