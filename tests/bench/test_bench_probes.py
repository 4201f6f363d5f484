"""Probe speed, side by side in one run: batched head masks with prefix reuse, and one forward plus
one backward for gradient importance, against the naive loop of one full forward pass per head.

Full mode (``ATTNLAB_BENCH=full``): a 4-layer x 8-head Transformer (d_model 128)
on 64 sequences of 128 tokens. Short mode keeps 4 layers x 8 heads on 16 sequences of 64 tokens.
Prefix reuse alone bounds the ablation speed-up at 2n/(n+1) = 1.6x for n = 4 layers (layer l's
heads rerun n - l layers instead of n); running several masks per pass adds what larger batches
gain on the CPU (~10-15% at these shapes). Ratios are recorded and printed, not asserted: a timed
assertion would flake on a shared machine. What is asserted does not depend on timing: the
batched numbers equal the naive loop's.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest
import torch

import probes
from harness import ModelConfig, Transformer
from probes.compare import ESTIMATORS
from reports.bench.reference import naive_head_ablation as naive_loop
from tests.bench.common import FULL, report

pytestmark = pytest.mark.bench

N_SEQ, POS = (64, 128) if FULL else (16, 64)
ROUNDS = 5 if FULL else 3


@pytest.fixture(scope="module")
def setup():
    model = Transformer(ModelConfig(n_layers=4, d_model=128, n_heads=8, d_vocab=64, n_ctx=128, seed=0)).eval()
    tokens = torch.randint(0, 64, (N_SEQ, POS), generator=torch.Generator().manual_seed(0))
    return model, tokens


def load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def test_bench_head_importance_vs_naive_loop(benchmark, setup):
    model, tokens = setup
    # the first call of each contender is its warm-up and its correctness run
    batched = benchmark.pedantic(lambda: probes.head_importance(model, tokens), rounds=1, iterations=1)
    naive = naive_loop(model, tokens)
    probes.head_importance(model, tokens, method="gradient")
    # same quantity by two routes in float32: batching changes summation order and kernel blocking
    # only; the bar for "identical numbers" is 1e-5 (tests/test_probes.py ATOL)
    got = torch.tensor(batched.sort_values(["layer", "head"]).loss_delta.to_numpy()).view_as(naive)
    torch.testing.assert_close(got, naive, atol=1e-5, rtol=0)

    # rounds interleave the three; each round's ratio compares calls made seconds apart, so the
    # median ratio resists the load swings of a shared machine better than a ratio of medians
    before = load()
    times: dict[str, list[float]] = {"naive": [], "ablation": [], "gradient": []}
    calls = {"naive": lambda: naive_loop(model, tokens),
             "ablation": lambda: probes.head_importance(model, tokens, method="ablation"),
             "gradient": lambda: probes.head_importance(model, tokens, method="gradient")}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    ratio = {name: statistics.median(n / t for n, t in zip(times["naive"], times[name], strict=True))
             for name in ("ablation", "gradient")}
    report(benchmark, f"head importance, 4x8 heads, {N_SEQ}x{POS} tokens, vs one forward per head",
           naive_s=med["naive"], ablation_s=med["ablation"], gradient_s=med["gradient"],
           ablation_speedup=ratio["ablation"], gradient_speedup=ratio["gradient"],
           max_abs_diff=float((got - naive).abs().max()), threads=float(torch.get_num_threads()),
           load_before=before, load_after=load())


def test_bench_prune_curve(benchmark, setup):
    model, tokens = setup
    fractions = [i / 10 for i in range(1, 11)]
    before = load()
    start = time.perf_counter()
    curve = benchmark.pedantic(lambda: probes.prune_curve(model, tokens, order=("importance", "random"),
                                                          fractions=fractions, seeds=(0, 1, 2)),
                               rounds=1, iterations=1)
    seconds = time.perf_counter() - start
    assert len(curve) == 4 * 10 and curve.loss.notna().all()
    report(benchmark, f"prune_curve, 3 seeds x 10 fractions, {N_SEQ}x{POS} tokens",
           seconds=seconds, budget_s=30.0, threads=float(torch.get_num_threads()), load_before=before,
           load_after=load())


# (n_layers, d_model, n_heads, sequences, tokens): the short shape, longer sequences, the
# full 64 x 128 shape (full mode only: its naive loop alone takes minutes on a shared CPU), 12 layers.
SHAPES = [(4, 128, 8, 16, 64), (4, 128, 8, 16, 128), *([(4, 128, 8, 64, 128)] if FULL else []),
          (12, 128, 8, 16 if FULL else 4, 128)]


def _paired(calls: dict, rounds: int) -> tuple[dict, dict]:
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times, {name: statistics.median(ts) for name, ts in times.items()}


def _ratio(times: dict, num: str, den: str) -> float:
    return statistics.median(a / b for a, b in zip(times[num], times[den], strict=True))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "L{}d{}H{}_{}x{}".format(*s))
def test_bench_ablation_ratio_across_shapes(benchmark, shape):
    """Leave-one-out vs the naive loop at several shapes, with today's CPU pass size and the old one
    (2**15 tokens per pass, probes.gates.TOKENS_PER_PASS), side by side in one run."""
    from probes import gates

    L, d, H, n, pos = shape
    model = Transformer(ModelConfig(n_layers=L, d_model=d, n_heads=H, d_vocab=64, n_ctx=pos, seed=0)).eval()
    tokens = torch.randint(0, 64, (n, pos), generator=torch.Generator().manual_seed(0))
    old_rows = gates.TOKENS_PER_PASS // pos
    naive = benchmark.pedantic(lambda: naive_loop(model, tokens), rounds=1, iterations=1)
    got = probes.head_importance(model, tokens)
    torch.testing.assert_close(torch.tensor(got.loss_delta.to_numpy()).view_as(naive), naive, atol=1e-5, rtol=0)
    probes.head_importance(model, tokens, batch_size=old_rows)  # warm-up
    before = load()
    times, med = _paired({"naive": lambda: naive_loop(model, tokens),
                          "ablation": lambda: probes.head_importance(model, tokens),
                          "old_pass": lambda: probes.head_importance(model, tokens, batch_size=old_rows)},
                         ROUNDS if FULL else 2)
    report(benchmark, f"leave-one-out vs one forward per head, {L}x{H} heads d{d}, {n}x{pos} tokens",
           naive_s=med["naive"], ablation_s=med["ablation"], ablation_speedup=_ratio(times, "naive", "ablation"),
           old_pass_speedup=_ratio(times, "naive", "old_pass"),
           prefix_bound=2 * L / (L + 1), threads=float(torch.get_num_threads()), load_before=before,
           load_after=load())


def test_bench_l0_gates_and_compare_vs_exact(benchmark, setup):
    """l0_gates and compare_estimators cost as multiples of exact leave-one-out, measured in one run."""
    model, tokens = setup
    opts = probes.L0Options(steps=100 if FULL else 30)
    benchmark.pedantic(lambda: probes.head_importance(model, tokens), rounds=1, iterations=1)
    before = load()
    last: dict = {}  # each contender's last result, checked below (what does not depend on timing)

    def kept(name, fn):
        return lambda: last.__setitem__(name, fn())

    times, med = _paired({
        "exact": kept("exact", lambda: probes.head_importance(model, tokens)),
        "l0_gates": kept("l0_gates", lambda: probes.head_importance(model, tokens, method="l0_gates",
                                                                    l0_options=opts)),
        "compare": kept("compare", lambda: probes.compare_estimators(model, tokens, l0_options=opts)),
    }, 3 if FULL else 2)
    report(benchmark, f"l0_gates ({opts.steps} steps) and compare_estimators vs exact leave-one-out, "
                      f"{N_SEQ}x{POS} tokens", exact_s=med["exact"], l0_gates_s=med["l0_gates"],
           compare_s=med["compare"], l0_over_exact=_ratio(times, "l0_gates", "exact"),
           compare_over_exact=_ratio(times, "compare", "exact"), threads=float(torch.get_num_threads()),
           load_before=before, load_after=load())
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    gates_open = last["l0_gates"].importance
    assert len(gates_open) == n_heads and gates_open.between(0, 1).all()  # P(gate != 0) per head
    compare = last["compare"]
    assert tuple(compare.columns) == probes.ESTIMATOR_COLUMNS and set(compare.method) == set(ESTIMATORS)
    exact = compare[compare.method == "ablation"]
    # ablation *is* exact leave-one-out: against itself both rank correlations are 1
    assert exact.spearman.tolist() == pytest.approx([1.0] * len(exact)) and \
        exact.kendall.tolist() == pytest.approx([1.0] * len(exact))


def _peak_rss_bytes() -> int:
    """This process's peak RSS since the last reset (Linux VmHWM, which ``clear_refs`` 5 resets)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS reset needs Linux /proc")
def test_bench_probe_peak_rss_at_a_large_vocabulary(benchmark):
    """Peak RSS (process-wide, VmHWM via /proc, reset before each call: not tracemalloc, which misses
    torch's allocations) of leave-one-out and of the attribution pass at a 49k vocabulary, the shape
    whose logits made the 135M probe peak at 5.7 GB: bounded by weights + one pass + results, i.e.
    gates.LOGIT_ELEMENTS of logits per forward and gates.GRAD_ACTIVATION_BYTES per backward."""
    from probes import gates

    n_layers = 4 if FULL else 2
    model = Transformer(ModelConfig(n_layers=n_layers, d_model=128, n_heads=8, d_vocab=49152, n_ctx=128,
                                    seed=0)).eval()
    tokens = torch.randint(0, 49152, (10, 128), generator=torch.Generator().manual_seed(0))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    peaks = {}

    def measured(name, call):
        def run():
            Path("/proc/self/clear_refs").write_text("5")
            base = _peak_rss_bytes()
            call()
            peaks[name] = _peak_rss_bytes() - base
        return run

    start = time.perf_counter()
    benchmark.pedantic(measured("leave_one_out", lambda: probes.head_importance(model, tokens)), rounds=1,
                       iterations=1)
    measured("attribution", lambda: probes.attribution_scores(model, tokens))()
    seconds = time.perf_counter() - start
    bound = 4 * gates.LOGIT_ELEMENTS + gates.GRAD_ACTIVATION_BYTES + 2 ** 28  # the passes' budgets + 256 MiB slack
    report(benchmark, f"peak RSS above the loaded model, {n_layers}x8 heads, vocab 49152, 10x128 tokens",
           loo_peak_mb=peaks["leave_one_out"] / 2 ** 20, attribution_peak_mb=peaks["attribution"] / 2 ** 20,
           weights_mb=weights / 2 ** 20, bound_mb=bound / 2 ** 20, seconds=seconds, load=load())
    assert max(peaks.values()) < bound, peaks
