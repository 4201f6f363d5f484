"""Checkpoints: exact resume, interruption, atomic swaps, refusals, and no pickle ever."""

import json
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import time

import pandas as pd
import pytest
import torch

from harness import ModelConfig, TrainConfig, Transformer, load_run, train
from harness.training.checkpoint import OLD, TMP, atomic_write_text, finish_swap, read_state
from harness.training.optim import make_optimizer, optimizer_state_from_tensors, optimizer_state_to_tensors

MODEL = ModelConfig(n_layers=1, d_model=32, n_heads=2, d_vocab=16, n_ctx=16)
CFG = TrainConfig(seq_len=16, batch_size=8, steps=12, warmup=3, eval_every=4, log_every=3, eval_batches=2,
                  checkpoint_every=5, label_smoothing=0.05)
# Everything a step computes; tokens_per_s, elapsed_s and mfu are wall-clock measurements.
EXACT = ["step", "lr", "train_loss", "val_loss", "val_accuracy", "grad_norm"]


pytestmark = pytest.mark.usefixtures("one_thread")


def weights(run_dir):
    return load_run(run_dir).state_dict()


def assert_same_run(a_dir, a_df, b_dir, b_df):
    pd.testing.assert_frame_equal(a_df[EXACT], b_df[EXACT], check_exact=True)
    wa, wb = weights(a_dir), weights(b_dir)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "weights differ bit for bit"


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One uninterrupted reference run per optimizer, shared by the resume tests."""
    runs = {}
    for opt in ("adamw", "momentum"):
        d = tmp_path_factory.mktemp(f"straight_{opt}")
        runs[opt] = (d, train(MODEL, CFG.replace(optimizer=opt), d, progress=False))
    return runs


@pytest.mark.parametrize("opt", ["adamw", "momentum"])
def test_stop_then_resume_is_bit_identical(tmp_path, straight, opt):
    cfg = CFG.replace(optimizer=opt)
    first = train(MODEL, cfg, tmp_path, stop_after=7, progress=False)  # 7: between log rows and checkpoints
    assert first["step"].max() == 6 and read_state(tmp_path)["step"] == 7
    rest = train(MODEL, cfg, tmp_path, resume=True, progress=False)
    assert_same_run(*straight[opt], tmp_path, rest)


def test_sigint_saves_at_the_step_boundary_and_resumes_exactly(tmp_path, straight):
    model = Transformer(MODEL)
    calls = {"n": 0}

    def interrupt(resid, hook):  # the signal arrives in the middle of step 4's forward pass
        calls["n"] += 1
        if calls["n"] == 4 and model.training:
            os.kill(os.getpid(), signal.SIGINT)
        return resid

    handle = model.blocks[0].hook_resid_pre.add_hook(interrupt)
    # what was installed before: Python's default, or SIG_IGN where the runner started us in the background
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match="after step 4"):
        train(model, CFG, tmp_path, progress=False)
    assert read_state(tmp_path)["step"] == 4
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
    model.reset_hooks()
    del handle
    rest = train(MODEL, CFG, tmp_path, resume=True, progress=False)
    assert_same_run(*straight["adamw"], tmp_path, rest)


def test_rows_written_after_the_checkpoint_are_replaced_not_duplicated(tmp_path, straight):
    """A run killed after step 9 with its last checkpoint at step 5 resumes from 5."""
    train(MODEL, CFG, tmp_path, stop_after=5, progress=False)
    saved = tmp_path.parent / "saved_checkpoint"
    shutil.copytree(tmp_path / "checkpoint", saved)
    train(MODEL, CFG, tmp_path, resume=True, stop_after=9, progress=False)
    assert pd.read_csv(tmp_path / "metrics.csv")["step"].max() == 9
    shutil.rmtree(tmp_path / "checkpoint")
    shutil.copytree(saved, tmp_path / "checkpoint")  # as if killed before the step-10 checkpoint
    rest = train(MODEL, CFG, tmp_path, resume=True, progress=False)
    assert_same_run(*straight["adamw"], tmp_path, rest)


def test_interrupted_swaps_are_recovered(tmp_path):
    run = tmp_path / "run"
    train(MODEL, CFG.replace(steps=4), run, stop_after=2, progress=False)
    ckpt = run / "checkpoint"
    step2 = shutil.copytree(ckpt, tmp_path / "step2")  # kept aside to play the previous checkpoint
    # Killed while writing: a partial checkpoint.tmp next to the good checkpoint is ignored.
    (run / TMP).mkdir()
    (run / TMP / "model.safetensors").write_bytes(b"\x00" * 5)
    assert read_state(run)["step"] == 2
    shutil.rmtree(run / TMP)
    train(MODEL, CFG.replace(steps=4), run, resume=True, progress=False)
    step4 = weights(run)
    # Killed between the two renames: checkpoint/ gone, the new (step 4) complete in checkpoint.tmp/ and
    # the previous (step 2) in checkpoint.old/. The two steps differ, so reading the wrong folder fails.
    os.rename(ckpt, run / TMP)
    shutil.copytree(step2, run / OLD)
    assert read_state(run)["step"] == 4
    assert all(torch.equal(step4[k], v) for k, v in weights(run).items())
    assert not ckpt.exists(), "readers never rename: a writer may be mid-swap"
    finish_swap(run)
    assert ckpt.is_dir() and not (run / OLD).exists() and not (run / TMP).exists()
    assert read_state(run)["step"] == 4
    # ... or with only checkpoint.old/ (step 2) left: it is read, and the next write restores order.
    shutil.rmtree(ckpt)
    shutil.copytree(step2, run / OLD)
    assert read_state(run)["step"] == 2
    df = train(MODEL, CFG.replace(steps=4), run, resume=True, progress=False)
    assert df["step"].max() == 4 and read_state(run)["step"] == 4
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "metrics.csv"]


def test_an_existing_run_is_refused_unless_resume_or_overwrite(tmp_path):
    cfg = CFG.replace(steps=4)
    train(MODEL, cfg, tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"different config \(train.lr\).*resume=True.*overwrite=True"):
        train(MODEL, cfg.replace(lr=0.1), tmp_path, progress=False)
    with pytest.raises(ValueError, match="already holds a run of this config"):
        train(MODEL, cfg, tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"model config differs in \['d_model'\]"):
        train(MODEL.replace(d_model=16), cfg, tmp_path, resume=True, progress=False)
    with pytest.raises(ValueError, match=r"differs in \['optimizer'\]"):
        train(MODEL, cfg.replace(optimizer="sgd"), tmp_path, resume=True, progress=False)
    longer = train(MODEL, cfg.replace(steps=6), tmp_path, resume=True, progress=False)  # steps may grow
    assert longer["step"].max() == 6
    fresh = train(MODEL, cfg.replace(lr=0.1), tmp_path, overwrite=True, progress=False)
    assert fresh["step"].tolist() == [3, 4] and (tmp_path / "checkpoint").is_dir()


def test_resume_without_a_checkpoint_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"checkpoint[/\\]config.json is missing"):
        train(MODEL, CFG, tmp_path, resume=True, progress=False)


@pytest.fixture
def run(tmp_path):
    train(MODEL, CFG.replace(steps=2), tmp_path, progress=False)
    return tmp_path


def test_missing_weights_name_the_file(run):
    (run / "checkpoint" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors is missing"):
        load_run(run)
    with pytest.raises(FileNotFoundError, match="model.safetensors is missing"):
        train(MODEL, CFG.replace(steps=4), run, resume=True, progress=False)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors"])
def test_truncated_safetensors_name_the_file(run, name):
    path = run / "checkpoint" / name
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match=f"{name} is not a valid safetensors file"):
        train(MODEL, CFG.replace(steps=4), run, resume=True, progress=False)


@pytest.mark.parametrize("name,text,match", [("state.json", "{not json", "state.json is corrupt"),
                                             ("state.json", '{"step": 1}', "state.json is corrupt: missing"),
                                             ("config.json", "[1, 2]", "config.json is corrupt"),
                                             ("config.json", '{"model": {"d_model": -1}, "train": {}}',
                                              "config.json does not hold a valid")])
def test_corrupt_json_names_the_file(run, name, text, match):
    (run / "checkpoint" / name).write_text(text)
    with pytest.raises(ValueError, match=match):
        train(MODEL, CFG.replace(steps=4), run, resume=True, progress=False)


class _Trap:
    """Unpickling this creates a file: proof that a pickle was executed."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickles_are_refused_never_unpickled(run):
    marker = run.parent / "pwned"
    path = run / "checkpoint" / "model.safetensors"
    path.write_bytes(pickle.dumps(_Trap(marker)))
    with pytest.raises(ValueError, match="pickle.*refusing"):
        load_run(run)
    assert not marker.exists()
    torch.save(Transformer(MODEL).state_dict(), path)  # a zip-format torch.save file
    with pytest.raises(ValueError, match="pickle.*refusing"):
        load_run(run)
    path.unlink()
    torch.save(Transformer(MODEL).state_dict(), run / "checkpoint" / "model.pt")
    with pytest.raises(FileNotFoundError, match=r"model.safetensors is missing; found \['model.pt'\]"):
        load_run(run)


def test_load_run_returns_the_trained_model(tmp_path):
    model = Transformer(MODEL.replace(tie_embeddings=True))
    train(model, CFG.replace(steps=3), tmp_path, progress=False)
    loaded = load_run(tmp_path)
    assert isinstance(loaded, Transformer) and not loaded.training
    assert loaded.config == model.config
    tokens = torch.randint(0, 16, (2, 16), generator=torch.Generator().manual_seed(0))
    model.eval()
    assert torch.equal(loaded(tokens), model(tokens))
    assert loaded.unembed.weight.data_ptr() == loaded.embed.weight.data_ptr()  # still tied
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nope")


def test_checkpoint_files_and_config(tmp_path):
    train(MODEL, CFG.replace(steps=2), tmp_path, progress=False)
    files = sorted(p.name for p in (tmp_path / "checkpoint").iterdir())
    assert files == ["config.json", "model.safetensors", "optimizer.safetensors", "state.json"]
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    assert ModelConfig.from_dict(config["model"]) == MODEL
    assert TrainConfig.from_dict(config["train"]) == CFG.replace(steps=2)
    state = read_state(tmp_path)
    assert set(state["rng"]) == {"torch", "task", "python", "numpy", "cuda"}


def test_optimizer_state_round_trips_through_tensors_and_json():
    model = Transformer(MODEL)
    opt = make_optimizer(model, CFG)
    for _ in range(2):
        model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
        opt.step()
    tensors, meta = optimizer_state_to_tensors(opt)
    fresh = make_optimizer(model, CFG)
    optimizer_state_from_tensors(fresh, tensors, meta, "test")
    a, b = opt.state_dict(), fresh.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for idx, st in a["state"].items():
        assert all(torch.equal(st[k], b["state"][idx][k]) for k in st)
    with pytest.raises(ValueError, match="holds AdamW state"):
        optimizer_state_from_tensors(make_optimizer(model, CFG.replace(optimizer="sgd")), tensors, meta, "test")


def test_atomic_write_leaves_no_temp_files(tmp_path):
    atomic_write_text(tmp_path / "a.txt", "one")
    atomic_write_text(tmp_path / "a.txt", "two")
    assert (tmp_path / "a.txt").read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_resume_bounds(run):
    with pytest.raises(ValueError, match="stop_after=2 is invalid.*already at step 2"):
        train(MODEL, CFG.replace(steps=4), run, resume=True, stop_after=2, progress=False)
    with pytest.raises(ValueError, match="past steps=1"):
        train(MODEL, CFG.replace(steps=1), run, resume=True, progress=False)
    before = (run / "metrics.csv").read_bytes()
    done = train(MODEL, CFG.replace(steps=2), run, resume=True, progress=False)  # finished: nothing to do
    assert done["step"].tolist() == [2] and (run / "metrics.csv").read_bytes() == before


def test_a_row_cut_short_by_a_kill_is_dropped_on_resume(tmp_path, straight):
    train(MODEL, CFG, tmp_path, stop_after=7, progress=False)
    with open(tmp_path / "metrics.csv", "a") as f:
        f.write("1")  # the start of the step-9 row, as a kill mid-write would leave it
    rest = train(MODEL, CFG, tmp_path, resume=True, progress=False)
    assert_same_run(*straight["adamw"], tmp_path, rest)


def _train_until_killed(run_dir):
    torch.set_num_threads(1)
    from harness.training.checkpoint import has_run

    train(MODEL, CFG.replace(checkpoint_every=1), run_dir, resume=has_run(run_dir), progress=False)
    os._exit(0)


def _has_checkpoint(run_dir) -> bool:
    return (run_dir / "checkpoint").exists() or (run_dir / OLD).exists()


def _kill_after(run_dir, delay: float, from_first_checkpoint: bool = False) -> None:
    """Start a training child and SIGKILL it ``delay`` seconds after it starts, or after the run's
    first checkpoint exists (so a kill lands past it however slow the machine is)."""
    child = mp.get_context("fork").Process(target=_train_until_killed, args=(run_dir,))
    child.start()  # fork: the child inherits the imports, so it starts at once
    if from_first_checkpoint:
        deadline = time.monotonic() + 120
        while child.is_alive() and not _has_checkpoint(run_dir) and time.monotonic() < deadline:
            time.sleep(0.005)
    child.join(timeout=delay)
    if child.is_alive():
        os.kill(child.pid, signal.SIGKILL)
    child.join()


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_sigkill_at_any_moment_leaves_a_resumable_run(tmp_path, straight):
    """Kill -9 a run that checkpoints every step, several times at different moments; every
    time the run must load, and the final resumed run must equal the straight one. The moments
    are wall-clock, so on a slow machine they may all fall before the first checkpoint: the last
    kill is timed from that checkpoint, so the resume always has one to start from."""
    for delay in (0.05, 0.3, 0.15, 0.45, 0.25):
        _kill_after(tmp_path, delay)
        if _has_checkpoint(tmp_path):
            assert isinstance(load_run(tmp_path), Transformer)
            assert read_state(tmp_path)["step"] <= CFG.steps
    _kill_after(tmp_path, 0.1, from_first_checkpoint=True)
    assert _has_checkpoint(tmp_path), "the child made no checkpoint in 120 s"
    rest = train(MODEL, CFG, tmp_path, resume=True, progress=False)
    assert_same_run(*straight["adamw"], tmp_path, rest)
