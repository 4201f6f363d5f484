"""Resources: a read-only or full disk fails early with a clear message and nothing half-written; a
diverging run stops at the first non-finite loss, naming the step, with the last good checkpoint kept.

Tests run as root, which ignores file permissions, so a read-only folder is a read-only bind mount
(chmod when not root) and a full disk is a tiny tmpfs; where ``mount`` is not permitted the full
disk falls back to RLIMIT_FSIZE (every write past the limit fails with EFBIG, as a full disk fails
with ENOSPC) and the read-only cases are skipped.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from harness import ModelConfig, TrainConfig, TrainingDiverged, load_run, train
from harness.training import loop as train_module
from harness.training.checkpoint import CHECKPOINT, TMP, read_state
from harness.training.tasks import make_task
from reports.cli import cli
from tests.helpers.fuzz import one_line_error, snapshot

MODEL = ModelConfig(n_layers=1, d_model=32, n_heads=2, d_vocab=16, n_ctx=16, attn_only=True)
CFG = TrainConfig(task="induction", seq_len=8, batch_size=8, steps=6, warmup=0, eval_every=2, eval_batches=1,
                  log_every=1, checkpoint_every=2, device="cpu")
ARGS = ["--n-layers", "1", "--d-model", "32", "--n-heads", "2", "--d-vocab", "16", "--n-ctx", "16", "--attn-only",
        "--task", "induction", "--seq-len", "8", "--batch-size", "8", "--steps", "6", "--warmup", "0",
        "--eval-every", "2", "--eval-batches", "1", "--log-every", "1", "--checkpoint-every", "2", "--device", "cpu",
        "--no-progress"]


pytestmark = pytest.mark.usefixtures("one_thread")


def invoke(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def _mount(*args: str) -> bool:
    if os.name != "posix" or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def _writes_fail(folder: Path) -> bool:
    try:
        (folder / ".probe").write_text("x")
    except OSError:
        return True
    (folder / ".probe").unlink()
    return False


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` read-only for this process, whatever its user; skips where that cannot be arranged."""
    folder.mkdir(parents=True, exist_ok=True)
    if _mount("--bind", str(folder), str(folder)):
        try:
            if not _mount("-o", "remount,bind,ro", str(folder)):
                pytest.skip("cannot remount a bind mount read-only here")
            assert _writes_fail(folder)
            yield folder
        finally:
            subprocess.run(["umount", str(folder)], capture_output=True)
    elif os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")] if p.is_dir()}
        for p in modes:
            p.chmod(0o555)
        try:
            assert _writes_fail(folder)
            yield folder
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
    else:
        pytest.skip("root ignores permissions and mount is not permitted: no way to make a read-only folder")


@contextlib.contextmanager
def small_disk(folder: Path, size: int, need_tmpfs: bool = False):
    """``folder`` on a disk that takes about ``size`` bytes: a tmpfs, or RLIMIT_FSIZE (files past ``size``)."""
    folder.mkdir(parents=True, exist_ok=True)
    if _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)):
        try:
            yield "tmpfs"
        finally:
            subprocess.run(["umount", str(folder)], capture_output=True)
        return
    if need_tmpfs:
        pytest.skip("needs a real small disk (mount -t tmpfs is not permitted here)")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield "rlimit"
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


@pytest.fixture
def no_steps(monkeypatch):
    """Counts training steps taken: a resource failure must come before the first."""
    calls = []
    original = train_module._Loop._step

    def step(self, *args, **kwargs):
        calls.append(args[0])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(train_module._Loop, "_step", step)
    return calls


# --- read-only disk -------------------------------------------------------------------------------------
def test_a_new_run_on_a_read_only_disk_fails_at_once(tmp_path, no_steps):
    with read_only(tmp_path / "ro") as ro:
        before = snapshot(ro)
        for run_dir in (ro / "run", ro):
            with pytest.raises(OSError, match=rf"cannot write into run directory {re.escape(str(run_dir))}: "
                                              r".*(Read-only file system|Permission denied)"):
                train(MODEL, CFG, run_dir, progress=False)
            err = one_line_error(invoke(["train", "--out", str(run_dir), *ARGS]))
            assert str(run_dir) in err and "cannot write" in err
        assert snapshot(ro) == before and no_steps == []


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("resources") / "run"
    train(MODEL, CFG.replace(steps=2), path, progress=False)
    return path


def test_resuming_or_reporting_a_run_on_a_read_only_disk_fails_at_once_and_changes_nothing(trained, tmp_path,
                                                                                         no_steps):
    shutil.copytree(trained, tmp_path / "ro")
    with read_only(tmp_path / "ro") as ro:
        before = snapshot(ro)
        for kwargs in ({"resume": True}, {"overwrite": True}):
            with pytest.raises(OSError, match=re.escape(str(ro))):
                train(MODEL, CFG, ro, progress=False, **kwargs)
        for extra in (["--resume"], ["--overwrite"]):
            assert str(ro) in one_line_error(invoke(["train", "--out", str(ro), *ARGS, *extra]))
        assert str(ro) in one_line_error(invoke(["report", str(ro)]))
        assert snapshot(ro) == before and no_steps == []
    assert read_state(tmp_path / "ro")["step"] == 2


def test_check_and_probe_on_a_read_only_run_fail_before_the_work(trained, tmp_path, monkeypatch):
    import probes
    import properties

    work = []
    monkeypatch.setattr(properties, "check_model", lambda *a, **k: work.append("check"))
    monkeypatch.setattr(probes, "head_importance", lambda *a, **k: work.append("probe"))
    shutil.copytree(trained, tmp_path / "ro")
    with read_only(tmp_path / "ro") as ro:
        before = snapshot(ro)
        for command in (["check", str(ro), "--max-examples", "1"], ["probe", str(ro), "--sequences", "2"]):
            err = one_line_error(invoke(command))
            assert f"cannot write into run directory {ro}" in err, err
        assert snapshot(ro) == before and work == []


# --- full disk ------------------------------------------------------------------------------------------
def test_a_new_run_on_a_full_disk_fails_before_training_and_leaves_no_partial_checkpoint(tmp_path, no_steps):
    """8 KiB: room for the write probe, not for a checkpoint (the weights alone are ~35 KB)."""
    for how in ("api", "cli"):
        with small_disk(tmp_path / how, 8192) as kind:
            run_dir = tmp_path / how / "run"
            if how == "api":
                with pytest.raises(OSError, match=rf"{re.escape(str(run_dir))}.*(No space left|File too large)"):
                    train(MODEL, CFG, run_dir, progress=False)
            else:
                err = one_line_error(invoke(["train", "--out", str(run_dir), *ARGS]))
                assert str(run_dir) in err and re.search("No space left|File too large", err), (kind, err)
            left = snapshot(tmp_path / how)
        assert set(left) <= {"./", "run/"}, (kind, left)  # at most the empty run folder: nothing half-written
    assert no_steps == []


def _pages(n: int) -> int:
    return -(-n // 4096) * 4096  # tmpfs charges whole pages


def test_a_disk_that_fills_mid_run_keeps_the_last_checkpoint_whole_and_resumable(tmp_path):
    """A disk with room for the first checkpoint (step 0) but not for the second beside it: the failed
    write is removed, the step-0 checkpoint still loads, and the run resumes elsewhere exactly."""
    straight = tmp_path / "straight"
    full = train(MODEL, CFG, straight, progress=False)
    probe_run = tmp_path / "probe"
    train(MODEL, CFG.replace(steps=1), probe_run, stop_after=1, progress=False)  # a checkpoint with optimizer state
    files = {p.name: _pages(p.stat().st_size) for p in (probe_run / CHECKPOINT).iterdir()}
    later = sum(files.values())  # a checkpoint with optimizer state
    step0 = later - files["optimizer.safetensors"] + 4096  # no optimizer state yet at step 0
    size = step0 + 4096 + later // 2  # + metrics.csv, + half of the step-2 checkpoint
    with small_disk(tmp_path / "disk", size, need_tmpfs=True):
        run_dir = tmp_path / "disk" / "run"
        with pytest.raises(OSError, match=rf"cannot write a checkpoint into {re.escape(str(run_dir))}"):
            train(MODEL, CFG, run_dir, progress=False)
        assert not (run_dir / TMP).exists(), "the failed checkpoint write must be removed"
        assert read_state(run_dir)["step"] == 0
        assert all(torch.isfinite(p).all() for p in load_run(run_dir).parameters())
        saved = tmp_path / "moved"
        shutil.copytree(run_dir, saved)
    rest = train(MODEL, CFG, saved, resume=True, progress=False)  # on a disk with room
    exact = ["step", "lr", "train_loss", "val_loss", "val_accuracy", "grad_norm"]
    pd.testing.assert_frame_equal(rest[exact], full[exact], check_exact=True)


# --- divergence ------------------------------------------------------------------------------------------
DIVERGE = CFG.replace(optimizer="sgd", lr=1e4, grad_clip=None, schedule="constant", steps=30, checkpoint_every=1,
                      eval_every=100)


def _replay_next_step(run_dir: Path, cfg: TrainConfig) -> tuple[float, float]:
    """Independent replay of the step after the checkpoint: its weights on the batch that step draws (the
    checkpoint stores the data generator's state); the plain cross-entropy and its gradient's global norm."""
    model = load_run(run_dir).train()
    gen = torch.Generator()
    gen.set_state(torch.frombuffer(bytearray(base64.b64decode(read_state(run_dir)["rng"]["task"])),
                                   dtype=torch.uint8).clone())
    task = make_task(cfg.task, MODEL.d_vocab, MODEL.n_ctx, cfg.seq_len, cfg.task_options)
    tokens, mask = task.batch(cfg.batch_size, gen)
    target = mask[:, 1:]
    loss = torch.nn.functional.cross_entropy(model(tokens)[:, :-1][target], tokens[:, 1:][target])
    loss.backward()
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))
    return float(loss.detach()), float(norm)


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def test_a_huge_learning_rate_stops_at_the_first_non_finite_loss_keeping_the_last_good_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"diverged at step \d+: the (training loss|gradient norm) is") as info:
        train(MODEL, DIVERGE, run_dir, progress=False)
    found = re.search(r"at step (\d+): the (training loss|gradient norm)", str(info.value))
    step, what = int(found.group(1)), found.group(2)
    assert 1 < step < DIVERGE.steps
    assert f"last good checkpoint (step {step - 1})" in str(info.value)
    metrics = pd.read_csv(run_dir / "metrics.csv")
    assert metrics["step"].tolist() == list(range(1, step))  # every step before it logged, none after
    assert metrics["train_loss"].map(_finite).all() and metrics["grad_norm"].map(_finite).all()  # finite before
    assert read_state(run_dir)["step"] == step - 1 and not (run_dir / TMP).exists()
    assert all(torch.isfinite(p).all() for p in load_run(run_dir).parameters())
    loss, norm = _replay_next_step(run_dir, DIVERGE)
    if what == "training loss":
        assert not _finite(loss), f"step {step} did not have a non-finite loss ({loss})"
    else:  # the loss was still finite; its gradient was not
        assert _finite(loss) and not _finite(norm), (loss, norm)
    # The same through the CLI: one line naming the step, exit 2.
    args = [*ARGS, "--optimizer", "sgd", "--lr", "1e4", "--grad-clip", "none", "--schedule", "constant",
            "--steps", "30", "--checkpoint-every", "1", "--eval-every", "100"]
    err = one_line_error(invoke(["train", "--out", str(tmp_path / "cli"), *args]))
    assert f"diverged at step {step}:" in err and f"checkpoint (step {step - 1})" in err
    assert read_state(tmp_path / "cli")["step"] == step - 1


def test_an_update_too_large_for_the_dtype_is_a_divergence_too(tmp_path):
    """In float16 an lr of 1e5 overflows the update itself (before any loss is non-finite)."""
    with pytest.raises(TrainingDiverged, match=r"diverged at step 1: the update is too large.*checkpoint \(step 0\)"):
        train(MODEL.replace(dtype="float16"), DIVERGE.replace(lr=1e5), tmp_path, progress=False)
    assert read_state(tmp_path)["step"] == 0
    assert all(torch.isfinite(p).all() for p in load_run(tmp_path).parameters())
