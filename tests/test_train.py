"""harness.train and its parts: config, schedules, loss, optimizer groups, metrics, divergence, the demo."""

import dataclasses
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from harness import ModelConfig, TrainConfig, Transformer, demo_configs, load_run, train
from harness.training.loop import TrainingDiverged
from harness.training.metrics import COLUMNS, cpu_matmul_rate, flops_per_token, non_embedding_params, peak_flops
from harness.training.optim import make_optimizer, param_groups, smoothed_cross_entropy
from harness.training.schedules import lr_at
from harness.training.tasks import make_task, shifted

TINY = ModelConfig(n_layers=1, d_model=32, n_heads=2, d_vocab=16, n_ctx=16)
TINY_TRAIN = TrainConfig(seq_len=16, batch_size=8, steps=6, warmup=2, eval_every=3, log_every=2,
                         eval_batches=1, checkpoint_every=None)


pytestmark = pytest.mark.usefixtures("one_thread")


# --- TrainConfig ------------------------------------------------------------------------------
def test_train_config_round_trips_through_json():
    cfg = TrainConfig(task="markov", task_options={"branching": 2}, betas=(0.8, 0.95), grad_clip=None)
    back = TrainConfig.from_json(cfg.to_json())
    assert back == cfg and isinstance(back.betas, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0


def test_train_config_touches_no_rng_and_copies_options():
    opts = {"min_prefix": 4}
    before = torch.get_rng_state()
    cfg = TrainConfig(task_options=opts)
    opts["min_prefix"] = 9
    assert torch.equal(before, torch.get_rng_state())
    assert cfg.task_options == {"min_prefix": 4} and cfg.device == "auto"


@pytest.mark.parametrize("changes,match", [
    ({"batch_size": 0}, "batch_size=0"), ({"lr": -1.0}, "lr=-1.0"), ({"optimizer": "lion"}, "optimizer='lion'"),
    ({"schedule": "step"}, "schedule='step'"), ({"betas": (1.0, 0.9)}, r"betas\[0\]=1.0"),
    ({"betas": (0.9,)}, "betas"), ({"label_smoothing": 1.0}, "label_smoothing=1.0"),
    ({"task": "lm"}, "unknown task 'lm'"), ({"task_options": {"bogus": 1}}, "no option.*bogus"),
    ({"grad_clip": 0.0}, "grad_clip=0.0"), ({"schedule": "noam", "warmup": 0}, "warmup=0"),
    ({"device": "tpu"}, "device='tpu'"), ({"steps": True}, "steps=True"), ({"checkpoint_every": 0}, "checkpoint_every"),
    ({"task_options": {"paths": object()}, "task": "text"}, "JSON"), ({"momentum": 1.0}, "momentum=1.0"),
])
def test_train_config_rejects_bad_values_by_name(changes, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**changes)


# --- schedules ---------------------------------------------------------------------------------
def test_noam_is_vaswanis_formula():
    cfg = TrainConfig(schedule="noam", lr=1.0, warmup=400, steps=10_000)
    for step in (1, 10, 399, 400, 401, 5000):
        expected = 512 ** -0.5 * min(step ** -0.5, step * 400 ** -1.5)
        assert lr_at(step, cfg, 512) == pytest.approx(expected, rel=1e-12)
    # the peak is at step == warmup
    assert max(range(1, 2000), key=lambda s: lr_at(s, cfg, 512)) == 400


def test_warmup_cosine_and_linear_shapes():
    cos = TrainConfig(schedule="warmup_cosine", lr=1.0, warmup=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(1, cos) == pytest.approx(0.1) and lr_at(10, cos) == 1.0 and lr_at(11, cos) == 1.0
    # halfway through the decay the cosine is at the midpoint between peak and floor
    assert lr_at(61, cos) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(500, cos) == pytest.approx(0.1)
    values = [lr_at(s, cos) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    lin = TrainConfig(schedule="warmup_linear", lr=2.0, warmup=0, steps=4)
    assert [lr_at(s, lin) for s in range(1, 6)] == [2.0, 1.5, 1.0, 0.5, 0.0]
    const = TrainConfig(schedule="constant", lr=0.5, warmup=4)
    assert [lr_at(s, const) for s in (1, 2, 4, 1000)] == [0.125, 0.25, 0.5, 0.5]


def test_lr_at_rejects_step_zero_and_noam_without_width():
    with pytest.raises(ValueError, match="step=0"):
        lr_at(0, TrainConfig())
    with pytest.raises(ValueError, match="d_model"):
        lr_at(1, TrainConfig(schedule="noam"))


# --- loss --------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.37])
def test_label_smoothing_matches_torch_and_the_decomposition(eps):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 11, generator=g, dtype=torch.float64) * 3
    target = torch.randint(0, 11, (50,), generator=g)
    ours = smoothed_cross_entropy(logits, target, eps)
    # float64 throughout: the two computations differ only by rounding, ~1e-15.
    torch.testing.assert_close(ours, F.cross_entropy(logits, target, label_smoothing=eps, reduction="none"),
                               rtol=0, atol=1e-12)
    q = torch.softmax(logits, -1)
    ce = -torch.log(q[torch.arange(50), target])
    h_uq = -(torch.log(q)).mean(-1)  # cross-entropy of the uniform distribution against q
    torch.testing.assert_close(ours, (1 - eps) * ce + eps * h_uq, rtol=0, atol=1e-12)


# --- optimizer groups ---------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_no_weight_decay_on_biases_norms_and_embeddings(tied):
    model = Transformer(TINY.replace(tie_embeddings=tied))
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    expected = {"blocks.0.attn.qkv.weight", "blocks.0.attn.o.weight", "blocks.0.mlp.w_in.weight",
                "blocks.0.mlp.w_out.weight"} | (set() if tied else {"unembed.weight"})
    assert decayed == expected
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("name,cls,extra", [("sgd", torch.optim.SGD, {"momentum": 0}),
                                            ("momentum", torch.optim.SGD, {"momentum": 0.8}),
                                            ("adam", torch.optim.Adam, {"betas": (0.7, 0.9)}),
                                            ("adamw", torch.optim.AdamW, {"betas": (0.7, 0.9)})])
def test_make_optimizer(name, cls, extra):
    opt = make_optimizer(Transformer(TINY), TrainConfig(optimizer=name, momentum=0.8, betas=(0.7, 0.9)))
    assert type(opt) is cls
    for key, value in extra.items():
        assert opt.param_groups[0][key] == value


def test_adamw_decay_is_decoupled_and_skips_no_decay_params():
    """With zero gradients Adam's update is 0, so only decoupled decay moves the weights:
    p <- p (1 - lr wd) (Loshchilov & Hutter 2019, Algorithm 2, line 12)."""
    model = Transformer(TINY)
    opt = make_optimizer(model, TrainConfig(optimizer="adamw", lr=0.1, weight_decay=0.5))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        factor = 1 - 0.1 * 0.5 if n in {"blocks.0.attn.qkv.weight", "unembed.weight"} else 1.0
        if n in {"blocks.0.attn.qkv.weight", "unembed.weight", "embed.weight", "blocks.0.ln1.w"}:
            torch.testing.assert_close(p, before[n] * factor, rtol=1e-6, atol=0)


# --- the loop ----------------------------------------------------------------------------------
def test_metrics_columns_rows_and_first_step_loss(tmp_path):
    cfg = TINY_TRAIN.replace(label_smoothing=0.1, log_every=1, steps=4, eval_every=2)
    df = train(TINY, cfg, tmp_path, progress=False)
    assert list(df.columns) == list(COLUMNS)
    assert df["step"].tolist() == [1, 2, 3, 4]
    assert df["val_loss"].notna().tolist() == [False, True, False, True]
    on_disk = pd.read_csv(tmp_path / "metrics.csv", float_precision="round_trip")
    pd.testing.assert_frame_equal(df, on_disk)
    finite = df[["lr", "train_loss", "grad_norm", "tokens_per_s", "elapsed_s", "mfu"]]
    assert torch.isfinite(torch.tensor(finite.to_numpy())).all()
    # Step 1's training loss, recomputed independently from the same seeded batch and the initial weights.
    tokens, mask = make_task("induction", 16, 16, 16).batch(8, torch.Generator().manual_seed(cfg.seed))
    pred, target = shifted(Transformer(TINY)(tokens), tokens, mask)
    expected = F.cross_entropy(pred, target, label_smoothing=0.1).item()
    assert df["train_loss"].iloc[0] == pytest.approx(expected, rel=1e-6)  # float32 forward: ~1e-7 apart
    # MFU is FLOPs/token x tokens/s over the measured CPU matmul peak.
    model = Transformer(TINY)
    mfu = flops_per_token(model, 16) * df["tokens_per_s"] / cpu_matmul_rate(torch.get_num_threads())
    torch.testing.assert_close(torch.tensor(df["mfu"].to_numpy()), torch.tensor(mfu.to_numpy()))


def test_flops_per_token_counts_non_embedding_params():
    cfg = ModelConfig(n_layers=2, d_model=8, n_heads=2, d_vocab=10, n_ctx=12, attn_only=True)
    model = Transformer(cfg)
    d = 8
    per_layer = 2 * d + (3 * d * d + 3 * d) + (d * d + d)  # ln1 (w, b), qkv, o
    n = 2 * per_layer + 2 * d + d * 10  # + ln_final + unembed; embed and pos_embed are lookups
    assert non_embedding_params(model) == n
    assert flops_per_token(model, 5) == 6 * n + 12 * 2 * d * 5
    tied = Transformer(cfg.replace(tie_embeddings=True))
    assert non_embedding_params(tied) == n  # a tied table counts once, as the unembedding matmul


def test_gradient_clipping_bounds_the_update(tmp_path):
    cfg = TINY_TRAIN.replace(optimizer="sgd", schedule="constant", warmup=0, lr=1.0, weight_decay=0.0,
                             grad_clip=1e-3, steps=1, log_every=1)
    model = Transformer(TINY)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    df = train(model, cfg, tmp_path, progress=False)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert df["grad_norm"].iloc[0] > 1e-2  # the reported norm is the one before clipping
    # SGD with lr 1 moves the weights by exactly the clipped gradient, of norm grad_clip.
    assert (after - before).norm().item() == pytest.approx(1e-3, rel=1e-3)


def test_progress_bar_only_when_asked(tmp_path, capsys):
    train(TINY, TINY_TRAIN.replace(steps=2), tmp_path / "quiet", progress=None)
    assert capsys.readouterr().err == ""  # pytest's stderr is not a terminal
    train(TINY, TINY_TRAIN.replace(steps=2), tmp_path / "loud", progress=True)
    err = capsys.readouterr().err
    assert "train" in err and "2/2" in err


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    model = Transformer(TINY)
    calls = {"n": 0}

    def poison(resid, hook):
        calls["n"] += 1
        return resid * math.nan if calls["n"] == 7 else resid

    model.blocks[0].hook_resid_pre.add_hook(poison)
    cfg = TINY_TRAIN.replace(steps=10, checkpoint_every=5, eval_every=100)
    with pytest.raises(TrainingDiverged, match=r"step 7: the training loss is nan.*checkpoint \(step 5\)"):
        train(model, cfg, tmp_path, progress=False)
    assert issubclass(TrainingDiverged, RuntimeError)
    from harness.training.checkpoint import read_state

    assert read_state(tmp_path)["step"] == 5
    loaded = load_run(tmp_path)
    assert all(torch.isfinite(p).all() for p in loaded.parameters())


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"model_or_cfg": "gpt2"}, TypeError, "ModelConfig or harness.Transformer"),
    ({"train_cfg": {}}, TypeError, "TrainConfig"),
    ({"run_dir": 3}, TypeError, "run_dir"),
    ({"stop_after": 0}, ValueError, "stop_after=0"),
    ({"stop_after": 7}, ValueError, "stop_after=7"),
    ({"resume": True, "overwrite": True}, ValueError, "contradict"),
    ({"progress": "yes"}, ValueError, "progress='yes'"),
    ({"train_cfg": TINY_TRAIN.replace(seq_len=32)}, ValueError, "n_ctx=16"),
    ({"train_cfg": TINY_TRAIN.replace(device="cuda")}, ValueError, "no CUDA"),
])
def test_train_rejects_bad_arguments_before_work(tmp_path, kwargs, exc, match):
    if torch.cuda.is_available() and "no CUDA" in match:
        pytest.skip("a GPU is present")
    args = {"model_or_cfg": TINY, "train_cfg": TINY_TRAIN, "run_dir": tmp_path / "run", "progress": False} | kwargs
    with pytest.raises(exc, match=match):
        train(**args)
    assert not (tmp_path / "run" / "metrics.csv").exists()


@pytest.mark.slow
def test_demo_learns_induction(tmp_path):
    """The learning requirement with a smaller budget: 300 of the demo's 500 steps reach >= 0.9.

    Measured (2 shared cores, one thread): 0.97-1.0 at step 300 over four seeds, 14-22 s.
    """
    model_cfg, train_cfg = demo_configs()
    assert train_cfg.task == "induction"
    df = train(model_cfg, train_cfg, tmp_path, stop_after=300, progress=False)
    curve = df.dropna(subset=["val_accuracy"])
    assert curve["step"].iloc[-1] == 300
    assert curve["val_accuracy"].iloc[-1] >= 0.9, curve[["step", "elapsed_s", "val_accuracy"]].to_string()
    assert curve["val_accuracy"].iloc[0] < 0.2  # it learned: chance on 64 tokens is ~0.02


@pytest.mark.parametrize("name,bf16,peak", [("NVIDIA H200", True, 989e12), ("NVIDIA H100 80GB HBM3", True, 989e12),
                                            ("NVIDIA H100 PCIe", True, 756e12), ("NVIDIA A100-SXM4-80GB", True, 312e12),
                                            ("NVIDIA A100-SXM4-80GB", False, 156e12)])
def test_gpu_peaks_come_from_the_table(monkeypatch, name, bf16, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0), bf16) == peak


def test_unknown_gpu_has_no_peak_and_cpu_peak_is_measured(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert math.isnan(peak_flops(torch.device("cuda", 0), True))
    rate = peak_flops(torch.device("cpu"), False)
    assert rate == cpu_matmul_rate(torch.get_num_threads()) and 1e8 < rate < 1e14
