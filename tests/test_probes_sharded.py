"""Sharded probes: under a 2-process gloo group, head_importance / prune_curve / redundancy split their
masks across ranks and return the one-process result, bit for bit, on every rank."""

import multiprocessing as mp
import os
import socket
import traceback

import pandas as pd
import pytest
import torch

import probes
from harness import ModelConfig, Transformer
from probes import _shard

MODEL = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=24, n_ctx=16, seed=3)


def _tokens() -> torch.Tensor:
    return torch.randint(0, MODEL.d_vocab, (12, 16), generator=torch.Generator().manual_seed(0))


def _probe_all() -> dict:
    """Every sharded probe, with batch sizes that give several data chunks and several masks per pass."""
    model, tokens = Transformer(MODEL).eval(), _tokens()
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    out = {}
    for bs in (8, 24):
        for method in ("ablation", "mean_ablation"):
            out[f"importance-{method}-{bs}"] = probes.head_importance(model, tokens, method=method, batch_size=bs)
        out[f"curve-{bs}"] = probes.prune_curve(model, tokens, order=("importance", "random"), method="ablation",
                                                seeds=(0, 1), batch_size=bs)
    out["curve-reestimate"] = probes.prune_curve(model, tokens, method="ablation", reestimate=True, seeds=(0,),
                                                 fractions=(0, 0.25, 0.5, 0.75), batch_size=8)
    out["redundancy"] = probes.redundancy(model, tokens, seeds=(0,), batch_size=8).to_frame()
    out = {k: v.astype(str) if k == "redundancy" else v for k, v in out.items()}
    out["forward_calls"] = pd.DataFrame({"n": [len(calls)]})
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out: mp.Queue) -> None:
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        try:
            assert _shard.world() == (rank, 2)
            out.put((rank, {k: v.to_dict("list") for k, v in _probe_all().items()}))
        finally:
            dist.destroy_process_group()
    except BaseException:  # report the failure instead of hanging the parent
        out.put((rank, traceback.format_exc()))


def test_shard_helpers_without_a_process_group_are_the_identity():
    masks = torch.rand(5, 2, 3)
    mine = _shard.shard_masks(masks)
    assert mine.tolist() == [0, 1, 2, 3, 4] and _shard.world() == (0, 1)
    values = torch.arange(5.0)
    assert torch.equal(_shard.gather(values, mine, 5), values)


@pytest.mark.slow
@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs the fork start method")
def test_two_processes_give_the_one_process_result_exactly(one_thread):
    single = _probe_all()
    ctx = mp.get_context("fork")  # the children inherit the imports; the parent has no process group
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, out)) for r in range(2)]
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
        calls = value.pop("forward_calls")["n"][0]
        assert calls < single["forward_calls"]["n"][0], "the ranks did not split the work"
        single_frames = {k: v for k, v in single.items() if k != "forward_calls"}
        for name, frame in single_frames.items():
            got = pd.DataFrame(value[name], index=frame.index).astype(frame.dtypes.to_dict())
            pd.testing.assert_frame_equal(got, frame, check_exact=True, obj=f"rank {rank} {name}")
