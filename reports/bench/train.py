"""Training-step rows: our ``Transformer`` vs :class:`PlainGPT`, and model FLOPs utilization.

A training step is forward, loss, backward and AdamW. On CUDA it runs under bf16 autocast
with TF32 matmuls, attention through ``scaled_dot_product_attention`` (flash kernels), and
optionally ``torch.compile`` (both contenders alike, so the ratio stays fair).

``torch.compile`` and hooks: TorchDynamo does not guard on nn.Module hook dictionaries
(``torch._dynamo.config.skip_nnmodule_hook_guards`` is True by default), so a graph traced with
no hook attached keeps running without the hooks added later: they silently never fire.
:class:`HookAwareCompiled` runs the compiled graph only while no hook is attached and the
eager model otherwise, so hooks always fire and no hook set triggers a recompilation.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.nn.functional as F

from harness.model.compiled import HookAwareCompiled
from harness.model.transformer import Transformer
from harness.training.metrics import flops_per_token, peak_flops
from reports.bench.core import Row, Shape, interleaved_times, medians, paired_ratio
from reports.bench.reference import PlainGPT

# The CPU "peak" is the fp32 rate of square matmuls of this size, as harness.training.metrics.cpu_matmul_rate
# measures it for the training metrics; here it is timed interleaved with the training steps.
PEAK_MATMUL_N = 512


def amp_context(device: torch.device, amp: bool) -> Callable[[], contextlib.AbstractContextManager]:
    """bf16 autocast on CUDA when ``amp``; nothing on CPU (the CPU peak is fp32)."""
    if amp and device.type == "cuda":
        return lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def make_train_step(forward: Callable, params: list, tokens: torch.Tensor, amp: bool) -> Callable[[], None]:
    """One step on ``tokens`` ``[batch, T+1]``: next-token loss over T positions, backward, AdamW."""
    device = tokens.device
    opt = torch.optim.AdamW(params, lr=1e-4, fused=device.type == "cuda")
    ctx = amp_context(device, amp)
    inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)

    def step() -> None:
        with ctx():
            logits = forward(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def matmul_peak_fn(flops: float, device: torch.device) -> tuple[Callable[[], None], float]:
    """A function doing about ``flops`` FLOPs of fp32 ``PEAK_MATMUL_N``-square matmuls, and its exact FLOPs.

    Timed as one more contender next to the training steps, its median time gives the peak rate
    under the same machine noise as the steps themselves.
    """
    n = PEAK_MATMUL_N
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device) for _ in range(2))
    out = torch.empty(n, n, device=device)
    reps = max(1, round(flops / (2.0 * n ** 3)))

    def fn() -> None:
        for _ in range(reps):
            torch.mm(a, b, out=out)

    return fn, 2.0 * n ** 3 * reps


def train_contenders(shape: Shape, device: torch.device, amp: bool, compile_models: bool
                     ) -> tuple[Transformer, dict[str, Callable[[], None]]]:
    """Our model and ``{"ours": step, "plain": step}``: training steps of ours and PlainGPT on the same tokens."""
    ours = Transformer(shape.config()).to(device).train()
    plain = PlainGPT(shape.n_layers, shape.d_model, shape.n_heads, shape.n_ctx, shape.d_vocab).to(device).train()
    n_ours, n_plain = (sum(p.numel() for p in m.parameters()) for m in (ours, plain))
    if n_ours != n_plain:  # the comparison is only fair for the same computation
        raise RuntimeError(f"train-step benchmark at {shape.label}: our model has {n_ours} parameters, "
                           f"PlainGPT {n_plain}: the shapes no longer match")
    if compile_models:
        # A fresh TorchDynamo cache per pair: graphs of earlier models count towards its recompile
        # limit, past which it silently falls back to eager.
        torch._dynamo.reset()
    fwd_ours: Callable = HookAwareCompiled(ours) if compile_models else ours
    fwd_plain: Callable = torch.compile(plain) if compile_models else plain
    tokens = shape.tokens(device, extra=1)
    steps = {"ours": make_train_step(fwd_ours, list(ours.parameters()), tokens, amp),
             "plain": make_train_step(fwd_plain, list(plain.parameters()), tokens, amp)}
    return ours, steps


def train_step_row(shape: Shape, device: torch.device, rounds: int, *, amp: bool = False,
                   compile_models: bool = False) -> Row:
    """Training step of ours vs PlainGPT at ``shape``: speed ratio plain time / our time, goal >= 1."""
    _, steps = train_contenders(shape, device, amp, compile_models)
    times = interleaved_times(steps, rounds=rounds, device=device)
    med = medians(times)
    return Row(f"train step vs plain GPT, {shape.label}", med["ours"], med["plain"], "s/step",
               paired_ratio(times, "plain", "ours"), ">=", 1.0)


def mfu_rows(shape: Shape, device: torch.device, rounds: int, *, amp: bool = False, compile_models: bool = False,
             goal: float = 0.75, warmup: int = 1) -> list[Row]:
    """Training-step speed vs PlainGPT and MFU at ``shape``, measured in one interleaved run.

    MFU (Chowdhery et al. 2022, PaLM, App. B) = FLOPs per token (6N + 12·L·d·T, Kaplan et al. 2020
    §2.1, :func:`harness.training.metrics.flops_per_token`) x tokens/s / peak FLOP/s. The peak is the
    datasheet bf16 rate on a known GPU, and on CPU the fp32 matmul rate timed next to the steps.
    """
    ours, steps = train_contenders(shape, device, amp, compile_models)
    fpt = flops_per_token(ours, shape.n_ctx)
    step_flops = fpt * shape.batch * shape.n_ctx
    peak: Optional[float] = None
    if device.type == "cuda":
        peak = peak_flops(device, amp)
    else:
        steps["peak"], peak_work = matmul_peak_fn(step_flops, device)
    times = interleaved_times(steps, rounds=rounds, warmup=warmup, device=device)
    med = medians(times)
    achieved, achieved_plain = step_flops / med["ours"], step_flops / med["plain"]
    if peak is None:  # CPU: MFU per round, against the peak timed in the same round
        peak = peak_work / med["peak"]
        mfu, mfu_plain = (paired_ratio(times, "peak", name) * step_flops / peak_work for name in ("ours", "plain"))
    else:
        mfu, mfu_plain = achieved / peak, achieved_plain / peak
    kind = ("bf16" if amp else "tf32") + " datasheet" if device.type == "cuda" else "fp32 matmul measured"
    note = f"peak {kind}; plain GPT MFU {mfu_plain:.1%}" if math.isfinite(peak) else \
        f"no datasheet peak for {torch.cuda.get_device_name(device)}"
    return [
        Row(f"train step vs plain GPT, {shape.label}", med["ours"], med["plain"], "s/step",
            paired_ratio(times, "plain", "ours"), ">=", 1.0),
        Row(f"MFU of the train step, {shape.label}", achieved, peak, "FLOP/s", mfu, ">=", goal, note),
    ]


def compiled_hook_check(device: torch.device, backend: str = "inductor") -> dict:
    """Whether a hook added after ``torch.compile`` fires: through :class:`HookAwareCompiled` (must)
    and through a bare ``torch.compile(model)`` (TorchDynamo's default: it does not).

    Returns ``{"compiled_hook_fires": bool, "compiled_after_removal_equal": bool,
    "bare_compile_hook_fires": bool}``.
    """
    shape = Shape(2, 64, 4, 16, 2, 64)
    model = Transformer(shape.config()).to(device).eval()
    tokens = shape.tokens(device)
    torch._dynamo.reset()  # a fresh cache: earlier graphs of other models must not be reused
    result = {}
    for label, fwd in (("compiled", HookAwareCompiled(model, backend=backend)),
                       ("bare_compile", torch.compile(model, backend=backend))):
        with torch.no_grad():
            before = fwd(tokens)
            fired: list[int] = []

            def zero(z: torch.Tensor, hook: Any, fired: list = fired) -> torch.Tensor:
                fired.append(1)
                return torch.zeros_like(z)

            with model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero)]):
                fwd(tokens)
            result[f"{label}_hook_fires"] = bool(fired)
            if label == "compiled":
                result["compiled_after_removal_equal"] = bool(torch.equal(fwd(tokens), before))
    return result
