"""Sharded probes, 2 processes (gloo, one torch thread each) against 1 process (one thread), side by side.

Leave-one-out ``head_importance`` and an ablation ``prune_curve`` on the probe benchmark's 4-layer x
8-head model (d_model 128); short mode 16 sequences x 64 tokens, full mode 64 x 128. Rounds
alternate: the two workers run a round together, then the parent runs it alone. On 2 shared
cores a speed-up is not expected (the two workers compete for them with each other and with other
jobs); the ratio is recorded and printed, and what is asserted does not depend on timing: both
ranks return the one-process numbers exactly.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import time
import traceback

import pandas as pd
import pytest
import torch

import probes
from harness import ModelConfig, Transformer
from tests.bench.common import FULL, report

pytestmark = pytest.mark.bench

N_SEQ, POS = (64, 128) if FULL else (16, 64)
ROUNDS = 5 if FULL else 3
CASES = ("head_importance", "prune_curve")


def _setup():
    model = Transformer(ModelConfig(n_layers=4, d_model=128, n_heads=8, d_vocab=64, n_ctx=128, seed=0)).eval()
    tokens = torch.randint(0, 64, (N_SEQ, POS), generator=torch.Generator().manual_seed(0))
    return model, tokens


def _call(case: str, model, tokens) -> pd.DataFrame:
    if case == "head_importance":
        return probes.head_importance(model, tokens, method="ablation")
    return probes.prune_curve(model, tokens, method="ablation", seeds=(0, 1))


def _worker(rank: int, port: int, inbox: mp.Queue, out: mp.Queue) -> None:
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        model, tokens = _setup()
        while (case := inbox.get()) is not None:
            dist.barrier()
            t0 = time.perf_counter()
            frame = _call(case, model, tokens)
            dist.barrier()
            out.put((rank, time.perf_counter() - t0, frame.to_dict("list")))
        dist.destroy_process_group()
    except BaseException:
        out.put((rank, None, traceback.format_exc()))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs the fork start method")
def test_bench_two_processes_vs_one(benchmark, one_thread):
    model, tokens = _setup()
    ctx = mp.get_context("fork")
    inboxes, out, port = [ctx.Queue(), ctx.Queue()], ctx.Queue(), _port()
    procs = [ctx.Process(target=_worker, args=(r, port, inboxes[r], out)) for r in range(2)]
    for p in procs:
        p.start()
    ratios: dict[str, list[float]] = {c: [] for c in CASES}
    load_before = os.getloadavg()[0]
    try:
        for i in range(ROUNDS + 1):  # round 0 is the warm-up (and the equality check)
            for case in CASES:
                for box in inboxes:
                    box.put(case)
                got = [out.get(timeout=600) for _ in range(2)]
                for rank, _, value in got:
                    assert not isinstance(value, str), f"rank {rank} failed:\n{value}"
                t0 = time.perf_counter()
                single = _call(case, model, tokens)
                t_single = time.perf_counter() - t0
                if i == 0:
                    for rank, _, value in got:
                        frame = pd.DataFrame(value, index=single.index).astype(single.dtypes.to_dict())
                        pd.testing.assert_frame_equal(frame, single, check_exact=True, obj=f"rank {rank} {case}")
                    continue
                ratios[case].append(max(t for _, t, _ in got) / t_single)
    finally:
        for box in inboxes:
            box.put(None)
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    report(benchmark, f"sharded probes, 2 processes / 1 process time ({N_SEQ}x{POS} tokens, 4x8 heads, "
           f"load {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)",
           **{f"{c}_2proc_over_1proc": statistics.median(r) for c, r in ratios.items()})
