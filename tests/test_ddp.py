"""Data-parallel training: 2 processes on CPU (gloo) match 1 process on the same global batch."""

import multiprocessing as mp
import os
import socket
import traceback

import pandas as pd
import pytest
import torch

from harness import ModelConfig, TrainConfig, load_run, train

MODEL = ModelConfig(n_layers=2, d_model=32, n_heads=2, d_vocab=32, n_ctx=32)
# batch 8 -> 4 sequences per rank; label smoothing and clipping make every part of the step count.
CFG = TrainConfig(seq_len=32, batch_size=8, steps=6, warmup=2, eval_every=3, log_every=1, eval_batches=2,
                  checkpoint_every=3, label_smoothing=0.1, grad_clip=0.5, device="cpu")
# Two ranks add their halves of each sum in a different order than one process does:
# float32 rounding, ~1e-7 relative; 1e-5 leaves ~100x that.
TOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, run_dir: str, out: mp.Queue) -> None:
    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                          LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
        df = train(MODEL, CFG, run_dir, progress=False)
        out.put((rank, df.to_dict("list")))
    except BaseException:  # report the failure instead of hanging the parent
        out.put((rank, traceback.format_exc()))


@pytest.mark.slow
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs the fork start method")
def test_two_processes_match_one(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = train(MODEL, CFG, tmp_path / "single", progress=False)
    finally:
        torch.set_num_threads(before)
    # fork: the children inherit the imported modules (no multi-second re-import of torch and
    # transformer_lens); the parent has no process group, so nothing distributed is inherited.
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, str(tmp_path / "ddp"), out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in procs:
            rank, value = out.get(timeout=120)
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for rank, value in results.items():
        assert not isinstance(value, str), f"rank {rank} failed:\n{value}"

    ddp = pd.read_csv(tmp_path / "ddp" / "metrics.csv")  # written by rank 0 alone
    assert ddp["step"].tolist() == single["step"].tolist() == [1, 2, 3, 4, 5, 6]
    for col in ("lr", "train_loss", "val_loss", "val_accuracy", "grad_norm"):
        torch.testing.assert_close(torch.tensor(ddp[col].to_numpy()), torch.tensor(single[col].to_numpy()),
                                   rtol=TOL, atol=TOL, equal_nan=True, msg=f"column {col}")
    rank1 = pd.DataFrame(results[1])  # rank 1 computes the same global numbers
    torch.testing.assert_close(torch.tensor(rank1["train_loss"].to_numpy()),
                               torch.tensor(single["train_loss"].to_numpy()), rtol=TOL, atol=TOL)
    a, b = load_run(tmp_path / "single").state_dict(), load_run(tmp_path / "ddp").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=TOL, atol=TOL, msg=f"weight {key}")
    worst = (ddp["train_loss"] - single["train_loss"]).abs().max()
    print(f"max |train_loss(2 processes) - train_loss(1 process)| = {worst:.3g}")
