"""Forward-pass rows: idle hooks, ``run_with_cache``, batched head probes, and a ``TransformerBridge``.

Each function builds its contenders, checks that they compute the same thing (the figures in
``checks``), and times them interleaved. All forward passes run under ``torch.no_grad()``, as
analysis does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

import harness.model.layers
import harness.model.transformer
from harness.errors import AttnlabError
from harness.model.transformer import Transformer
from probes import head_importance
from reports.bench.core import Row, Shape, interleaved_times, medians, paired_ratio
from reports.bench.reference import hf_gpt2_pair, naive_head_ablation


@contextlib.contextmanager
def hook_points(mode: str) -> Iterator[None]:
    """Change how ``harness`` treats hook points for the duration: ``"bypassed"``: not there at all
    (``hook`` returns its input, nothing is active); ``"called"``: every hook point called as a module,
    as TransformerLens's own models do.
    """
    if mode not in ("bypassed", "called"):
        raise AttnlabError(f"hook_points mode={mode!r} is invalid: expected 'bypassed' or 'called'")
    layers, transformer = harness.model.layers, harness.model.transformer
    for module, name in ((layers, "hook"), (layers, "active"), (transformer, "hook")):
        if not callable(getattr(module, name, None)):
            raise RuntimeError(f"{module.__name__}.{name} is gone: the hook benchmark needs updating")
    saved = harness.model.layers.hook, harness.model.layers.active, harness.model.transformer.hook
    if mode == "bypassed":
        harness.model.layers.hook = harness.model.transformer.hook = lambda hp, x: x
        harness.model.layers.active = lambda hp: False
    else:
        harness.model.layers.hook = harness.model.transformer.hook = lambda hp, x: hp(x)
    try:
        yield
    finally:
        harness.model.layers.hook, harness.model.layers.active, harness.model.transformer.hook = saved


def idle_hook_row(shape: Shape, device: torch.device, rounds: int) -> Row:
    """Forward with every hook point idle vs the same model with its hook points bypassed: goal <= 1.03."""
    model = Transformer(shape.config()).to(device).eval()
    tokens = shape.tokens(device)

    def run(mode: str | None):
        def fn() -> None:
            with torch.no_grad(), (hook_points(mode) if mode else contextlib.nullcontext()):
                model(tokens)
        return fn

    times = interleaved_times({"idle": run(None), "bypassed": run("bypassed"), "called": run("called")},
                              rounds=rounds, device=device)
    med = medians(times)
    note = f"calling every hook point instead: {paired_ratio(times, 'called', 'bypassed') - 1:+.1%}"
    return Row(f"forward, idle hooks vs bypassed, {shape.label}", med["idle"], med["bypassed"], "s",
               paired_ratio(times, "idle", "bypassed"), "<=", 1.03, note)


def _bytes(cache: dict) -> int:
    return sum(t.numel() * t.element_size() for t in cache.values())


def cache_rows(shape: Shape, device: torch.device, rounds: int, checks: dict) -> list[Row]:
    """``run_with_cache`` (every hook; one hook) vs a plain forward, and the memory the cache keeps."""
    model = Transformer(shape.config()).to(device).eval()
    tokens = shape.tokens(device)
    one = f"blocks.{shape.n_layers // 2}.hook_resid_post"
    with torch.no_grad():
        _, full = model.run_with_cache(tokens)
        _, single = model.run_with_cache(tokens, names_filter=one)
    checks["cache_all_keys_missing"] = len(set(model.hook_dict) - set(full))
    checks["cache_one_extra_keys"] = len(set(single) - {one})
    requested = shape.batch * shape.n_ctx * shape.d_model * model.W_E.element_size()

    def fwd() -> None:
        with torch.no_grad():
            model(tokens)

    def cached(names: Any):
        def fn() -> None:
            with torch.no_grad():
                model.run_with_cache(tokens, names_filter=names)
        return fn

    times = interleaved_times({"plain": fwd, "all": cached(None), "one": cached(one)}, rounds=rounds, device=device)
    med = medians(times)
    return [
        Row(f"run_with_cache, every hook vs forward, {shape.label}", med["all"], med["plain"], "s",
            paired_ratio(times, "all", "plain"), "<=", 1.5, f"{len(full)} activations, {_bytes(full) / 2**20:.1f} MiB"),
        Row(f"run_with_cache, names_filter one hook vs forward, {shape.label}", med["one"], med["plain"], "s",
            paired_ratio(times, "one", "plain"), "<=", 1.05),
        Row("run_with_cache, names_filter one hook: bytes kept / bytes requested", _bytes(single), requested,
            "bytes", _bytes(single) / requested, "<=", 1.0, f"keys kept: {sorted(single)}"),
    ]


def probe_rows(shape: Shape, device: torch.device, rounds: int, checks: dict) -> list[Row]:
    """Leave-one-out ablation (batched, prefix reuse) and gradient importance vs one forward per head."""
    model = Transformer(shape.config()).to(device).eval()
    tokens = shape.tokens(device)
    naive = naive_head_ablation(model, tokens)
    ours = head_importance(model, tokens, method="ablation")
    # Same quantity by two routes in float32: batching changes summation order only, so the loss
    # deltas (differences of losses ~ ln d_vocab) agree to a few float32 ulps of the loss.
    checks["ablation_vs_naive_max_abs"] = float((torch.tensor(ours["loss_delta"].to_numpy()).view_as(naive)
                                                 - naive).abs().max())
    head_importance(model, tokens, method="gradient")  # warm-up; the two calls above warmed the others
    times = interleaved_times({
        "naive": lambda: naive_head_ablation(model, tokens),
        "ablation": lambda: head_importance(model, tokens, method="ablation"),
        "gradient": lambda: head_importance(model, tokens, method="gradient"),
    }, rounds=rounds, warmup=0, device=device)
    med = medians(times)
    n = shape.n_layers * shape.n_heads
    return [
        Row(f"head ablation (batched, prefix reuse) vs {n + 1} forwards, {shape.label}", med["ablation"],
            med["naive"], "s", paired_ratio(times, "naive", "ablation"), ">=", 1.5),
        Row(f"gradient importance vs {n + 1} forwards, {shape.label}", med["gradient"], med["naive"], "s",
            paired_ratio(times, "naive", "gradient"), ">=", 5.0),
    ]


def bridge_rows(shape: Shape, device: torch.device, rounds: int, checks: dict) -> list[Row]:
    """Ours vs a Hugging Face GPT-2 of the same shapes and weights in a ``TransformerBridge``."""
    ours, bridge = hf_gpt2_pair(shape.n_layers, shape.d_model, shape.n_heads, shape.n_ctx, shape.d_vocab)
    ours, bridge = ours.to(device), bridge.to(device)
    tokens = shape.tokens(device)
    with torch.no_grad():
        # Compatibility mode may center the unembedding, which shifts each position's logits by a
        # constant; log-probabilities are invariant to that, so they are what must agree.
        a, b = ours(tokens).log_softmax(-1), _logits(bridge(tokens)).log_softmax(-1)
    checks["bridge_logprob_max_abs"] = float((a - b).abs().max())

    def call(fn):
        def run() -> None:
            with torch.no_grad():
                fn(tokens)
        return run

    times = interleaved_times({"ours": call(ours), "bridge": call(bridge), "ours_cache": call(ours.run_with_cache),
                               "bridge_cache": call(bridge.run_with_cache)}, rounds=rounds, device=device)
    med = medians(times)
    return [
        Row(f"forward vs HF GPT-2 in TransformerBridge, {shape.label}", med["ours"], med["bridge"], "s",
            paired_ratio(times, "bridge", "ours"), ">=", 1.0),
        Row(f"run_with_cache vs HF GPT-2 in TransformerBridge, {shape.label}", med["ours_cache"],
            med["bridge_cache"], "s", paired_ratio(times, "bridge_cache", "ours_cache"), ">=", 1.0),
    ]


def _logits(out: Any) -> Tensor:
    return out if isinstance(out, Tensor) else out.logits
