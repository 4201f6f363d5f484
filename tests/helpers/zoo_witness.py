"""Witnesses for the zoo's findings (tests/helpers/zoo.py FINDINGS), each independent of the property suite.

Each function rebuilds the tiny model, shows the bug with the raw Hugging Face model or a
hand-made comparison, and returns one line saying what it saw; it raises AssertionError when the
bug no longer reproduces (so tests/test_zoo.py turns red when it is fixed upstream).
"""

from __future__ import annotations

from typing import Optional

import torch

from tests.helpers.zoo import build

FIRST, SECOND = torch.tensor([[3, 5]]), torch.tensor([[3, 9]])  # differ only at position 1


def _logits(model, x, **kw):
    with torch.no_grad():
        return model(input_ids=x, **kw).logits


def falcon_output_attentions_leaks_future(model: Optional[torch.nn.Module] = None) -> str:
    """Falcon (no ALiBi, sdpa): with output_attentions=True its eager branch adds sdpa's *boolean* mask
    to the scores (True -> +1, False -> +0) instead of masking, so every query sees the future.

    Witness: the raw HF model. Position 0's logits do not depend on token 1 in the plain forward, but do
    with output_attentions=True; the returned weights of query 0 on key 1 are > 0.
    """
    model = build("falcon") if model is None else model  # the census passes its own tiny Falcon
    plain = (_logits(model, SECOND) - _logits(model, FIRST))[0, 0].abs().max()
    masks = []
    attn = model.transformer.h[0].self_attention
    handle = attn.register_forward_pre_hook(lambda m, a, kw: masks.append(kw["attention_mask"].dtype), with_kwargs=True)
    with torch.no_grad():
        a = model(input_ids=FIRST, output_attentions=True)
        b = model(input_ids=SECOND, output_attentions=True)
    handle.remove()
    leak = (b.logits - a.logits)[0, 0].abs().max()
    future = a.attentions[0][0, :, 0, 1].max()
    assert float(plain) == 0.0 and float(leak) > 1e-6 and float(future) > 0.0, (plain, leak, future)
    assert masks[0] == torch.bool, masks  # the mask its eager branch adds to the scores
    return (f"position 0's logits move by {float(leak):.3g} when token 1 changes under output_attentions=True "
            f"(0 without); query 0's weight on key 1: {float(future):.3g}; the mask added to the scores is "
            f"{masks[0]}")


def _bridge(arch):
    from harness.adapters import BridgeAdapter

    return BridgeAdapter.from_hf(build(arch))


def bridge_openai_not_causal() -> str:
    """TransformerLens's bridge for OpenAI GPT drops the causal mask: its logits differ from the HF model's,
    and position 0 depends on token 1.

    Witness: the raw HF model (built with the same seed) is causal and disagrees with the bridge.
    """
    hf = build("openai")
    bridge = _bridge("openai")
    hf_moves = (_logits(hf, SECOND) - _logits(hf, FIRST))[0, 0].abs().max()
    with torch.no_grad():
        br_a, br_b = bridge(FIRST), bridge(SECOND)
    br_moves = (br_b - br_a)[0, 0].abs().max()
    differs = (br_a - _logits(hf, FIRST)).abs().max()
    assert float(hf_moves) == 0.0 and float(br_moves) > 1e-6 and float(differs) > 1e-6, (hf_moves, br_moves, differs)
    return (f"bridge: position 0 moves by {float(br_moves):.3g} when token 1 changes (HF model: 0); bridge logits "
            f"differ from the HF model's by {float(differs):.3g}")


def bridge_attn_scores_is_pattern(arch: str) -> str:
    """TransformerLens's bridge for GPT-Neo / XGLM fires ``hook_attn_scores`` with the post-softmax pattern.

    Witness: TransformerLens defines ``hook_pattern = softmax(hook_attn_scores)``; here
    ``hook_attn_scores`` equals ``hook_pattern`` (rows of non-negative numbers summing to 1) and its
    softmax does not give the pattern. The bridge's logits still equal the HF model's.
    """
    bridge = _bridge(arch)
    x = torch.tensor([[3, 5, 7]])
    with torch.no_grad():
        _, cache = bridge.run_with_cache(x)
    scores, pattern = cache["blocks.0.attn.hook_attn_scores"], cache["blocks.0.attn.hook_pattern"]
    same = torch.equal(scores, pattern)
    off = float((scores.softmax(-1) - pattern).abs().max())
    assert same and off > 1e-3, (same, off)
    return (f"blocks.0.attn.hook_attn_scores equals hook_pattern exactly (row sums {scores.sum(-1).min():.3g}.."
            f"{scores.sum(-1).max():.3g}); softmax(scores) is off the pattern by {off:.3g}")


def bridge_gpt_neo_attn_scores_is_pattern() -> str:
    return bridge_attn_scores_is_pattern("gpt_neo")


def bridge_xglm_attn_scores_is_pattern() -> str:
    return bridge_attn_scores_is_pattern("xglm")


WITNESSES = {f.__name__: f for f in (falcon_output_attentions_leaks_future, bridge_openai_not_causal,
                                     bridge_gpt_neo_attn_scores_is_pattern, bridge_xglm_attn_scores_is_pattern)}
