"""The hooked Transformer: hook names, TransformerLens helpers, fast vs explicit path, KV cache."""

import itertools

import pytest
import torch
from transformer_lens import ActivationCache

from harness import KVCache, ModelConfig, Transformer

GOLDEN_BLOCK = [
    "hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized",
    "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z",
    "hook_attn_out", "hook_resid_mid", "ln2.hook_scale", "ln2.hook_normalized",
    "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out", "hook_resid_post",
]


def small(**kw) -> Transformer:
    base = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=50, n_ctx=32, seed=1, init_range=0.2)
    base.update(kw)
    return Transformer(ModelConfig(**base)).eval()


def tokens(batch=3, pos=10, vocab=50, seed=0):
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def test_golden_hook_names_in_order():
    model = small()
    expected = ["hook_embed", "hook_pos_embed"]
    for layer in range(2):
        expected += [f"blocks.{layer}.{name}" for name in GOLDEN_BLOCK]
    expected += ["ln_final.hook_scale", "ln_final.hook_normalized"]
    assert list(model.hook_dict) == expected


def test_optional_hook_points():
    rot = small(positional_embedding_type="rotary", use_attn_result=True, gated_mlp=True, act_fn="silu")
    names = list(rot.hook_dict)
    assert "hook_pos_embed" not in names
    assert names[names.index("blocks.0.attn.hook_v") + 1: names.index("blocks.0.attn.hook_v") + 3] == [
        "blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"]
    assert "blocks.0.attn.hook_result" in names and "blocks.0.mlp.hook_pre_linear" in names
    attn_only = small(attn_only=True, norm_placement="post")
    assert not any("mlp" in n or "resid_mid" in n for n in attn_only.hook_dict)
    assert "ln_final.hook_scale" not in attn_only.hook_dict  # post-norm already normalizes each block


def test_hook_shapes():
    model = small(positional_embedding_type="rotary", use_attn_result=True)
    _, cache = model.run_with_cache(tokens(2, 7))
    b, p, d, h, dh = 2, 7, 32, 4, 8
    assert cache["hook_embed"].shape == (b, p, d)
    assert cache["blocks.1.attn.hook_rot_q"].shape == (b, p, h, dh)
    assert cache["blocks.1.attn.hook_pattern"].shape == (b, h, p, p)
    assert cache["blocks.1.attn.hook_result"].shape == (b, p, h, d)
    assert cache["blocks.1.ln1.hook_scale"].shape == (b, p, 1)
    assert cache["blocks.1.mlp.hook_post"].shape == (b, p, 128)


def test_hooks_removed_after_block_that_raised():
    model = small()
    calls = []

    def spy(x, hook):
        calls.append(hook.name)

    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", spy), ("hook_embed", spy)]):
            model(tokens())
            raise RuntimeError("boom")
    assert calls == ["hook_embed", "blocks.0.attn.hook_pattern"]
    assert not any(hp.has_hooks() for hp in model.hook_points())
    assert not any(hp._forward_hooks or hp._backward_hooks for hp in model.hook_points())
    model(tokens())
    assert len(calls) == 2


def test_identity_hook_changes_nothing_and_fast_path_equals_explicit():
    # The explicit path materializes softmax(QK^T/sqrt(d)); SDPA fuses it. Same math in float32,
    # different summation order: 1e-5 absolute on logits of order 1.
    for pos_type, direction in itertools.product(["standard", "rotary", "alibi", "none"], ["causal", "bidirectional"]):
        model = small(positional_embedding_type=pos_type, attention_dir=direction, n_key_value_heads=2)
        t = tokens()
        fast = model(t)
        hooked = model.run_with_hooks(t, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda x, hook: x)])
        torch.testing.assert_close(hooked, fast, atol=1e-5, rtol=0)
        mask = torch.ones_like(t)
        mask[0, :3] = 0
        mask[1, -2:] = 0
        fast_m = model(t, attention_mask=mask)
        hooked_m = model.run_with_hooks(t, attention_mask=mask,
                                        fwd_hooks=[("blocks.0.attn.hook_attn_scores", lambda x, hook: x),
                                                   ("blocks.1.attn.hook_attn_scores", lambda x, hook: x)])
        torch.testing.assert_close(hooked_m, fast_m, atol=1e-5, rtol=0)


def test_float64_explicit_recomputation_of_one_layer():
    """hook_attn_scores == q·k/sqrt(d_head) + causal mask, recomputed in float64 from hook_q/hook_k."""
    model = small()
    _, cache = model.run_with_cache(tokens())
    q = cache["blocks.1.attn.hook_q"].double()
    k = cache["blocks.1.attn.hook_k"].double()
    ref = torch.einsum("bqhd,bkhd->bhqk", q, k) / 8**0.5
    ref = ref.masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(cache["blocks.1.attn.hook_attn_scores"].double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"].double(), ref.softmax(-1), atol=1e-6, rtol=0)


def test_weight_views_match_activations():
    model = small(n_key_value_heads=2)
    _, cache = model.run_with_cache(tokens())
    attn = model.blocks[0].attn
    x = cache["blocks.0.ln1.hook_normalized"]
    q = torch.einsum("bpm,hmd->bphd", x, attn.W_Q) + attn.b_Q
    k = torch.einsum("bpm,hmd->bphd", x, attn.W_K) + attn.b_K
    torch.testing.assert_close(q, cache["blocks.0.attn.hook_q"], atol=1e-5, rtol=0)
    torch.testing.assert_close(k.repeat_interleave(2, dim=2), cache["blocks.0.attn.hook_k"], atol=1e-5, rtol=0)
    out = torch.einsum("bphd,hdm->bpm", cache["blocks.0.attn.hook_z"], attn.W_O) + attn.b_O
    torch.testing.assert_close(out, cache["blocks.0.hook_attn_out"], atol=1e-5, rtol=0)
    assert attn.W_Q.shape == (4, 32, 8) and attn.W_K.shape == (2, 32, 8) and attn.W_O.shape == (4, 8, 32)
    assert model.W_U.shape == (32, 50) and model.W_E.shape == (50, 32) and model.W_pos.shape == (32, 32)
    assert model.blocks[0].mlp.W_in.shape == (32, 128) and model.blocks[0].mlp.W_out.shape == (128, 32)
    with torch.no_grad():  # views write through to the fused parameter
        attn.W_Q[1] *= 0
    assert attn.qkv.weight[8:16].abs().sum() == 0


def test_activation_cache_helpers():
    model = small()
    t = tokens()
    logits, raw = model.run_with_cache(t)
    cache = ActivationCache(raw, model)
    stack = cache.stack_head_results(layer=-1, incl_remainder=True)
    assert stack.shape == (2 * 4 + 1, 3, 10, 32)
    # By construction of the remainder this is exact up to float32 re-summation.
    torch.testing.assert_close(stack.sum(0), cache["blocks.1.hook_resid_post"], atol=1e-5, rtol=0)
    # Non-trivial: the head results plus biases, embeddings and MLPs rebuild resid_post.
    heads = cache.stack_head_results(layer=-1).sum(0)
    rest = sum(cache["hook_embed"] + cache["hook_pos_embed"] for _ in [0])
    for layer in range(2):
        rest = rest + model.blocks[layer].attn.b_O + cache[f"blocks.{layer}.hook_mlp_out"]
    torch.testing.assert_close(heads + rest, cache["blocks.1.hook_resid_post"], atol=1e-5, rtol=0)
    decomposed = cache.decompose_resid(layer=-1)
    torch.testing.assert_close(decomposed.sum(0), cache["blocks.1.hook_resid_post"], atol=1e-5, rtol=0)
    accumulated = cache.accumulated_resid(layer=-1, apply_ln=True)
    final = cache["ln_final.hook_normalized"]
    torch.testing.assert_close(accumulated[-1], final, atol=1e-4, rtol=0)
    torch.testing.assert_close(final @ model.W_U, logits, atol=1e-5, rtol=0)


def test_transformer_lens_patching_runs_on_our_model():
    from transformer_lens import patching

    model = small()
    clean, corrupt = tokens(seed=1), tokens(seed=2)
    _, clean_cache = model.run_with_cache(clean)
    clean_cache = ActivationCache(clean_cache, model)
    metric = lambda logits: logits[:, -1].logsumexp(-1).mean()  # noqa: E731
    result = patching.get_act_patch_resid_pre(model, corrupt, clean_cache, metric)
    assert result.shape == (2, 10)
    # Each cell equals our own hand-written patch of that (layer, position).
    def patch(x, hook):
        x = x.clone()
        x[:, 3] = clean_cache["blocks.1.hook_resid_pre"][:, 3]
        return x

    by_hand = metric(model.run_with_hooks(corrupt, fwd_hooks=[("blocks.1.hook_resid_pre", patch)]))
    torch.testing.assert_close(result[1, 3], by_hand.detach(), atol=1e-5, rtol=0)
    assert result[1, 3] != metric(model(corrupt))


def test_start_and_stop_at_layer_compose():
    model = small()
    t = tokens()
    mask = torch.ones_like(t)
    mask[:, :2] = 0
    for layer in range(3):
        resid = model(t, attention_mask=mask, stop_at_layer=layer)
        rest = model(resid, attention_mask=mask, start_at_layer=layer)
        torch.testing.assert_close(rest, model(t, attention_mask=mask), atol=1e-6, rtol=0)


@pytest.mark.parametrize("pos_type", ["standard", "sinusoidal", "rotary", "alibi", "none"])
def test_kv_cache_equals_full_recompute(pos_type):
    # Incremental decoding does the same arithmetic on the same values, but SDPA sees different
    # shapes: 1e-5 on logits.
    model = small(positional_embedding_type=pos_type, n_key_value_heads=2)
    t = tokens(3, 6)
    mask = torch.ones_like(t)
    mask[0, :2] = 0  # left-padded rows
    mask[2, :5] = 0
    out, step_logits = model.generate(t, 8, temperature=0, attention_mask=mask, return_logits=True)
    full_mask = torch.cat((mask, torch.ones(3, 8, dtype=torch.long)), dim=1)
    full = model(out, attention_mask=full_mask)[:, 5:-1]
    torch.testing.assert_close(step_logits, full, atol=1e-5, rtol=0)
    # each left-padded row decodes exactly as it does alone, unpadded
    alone, _ = model.generate(t[2:, 5:], 8, temperature=0, return_logits=True)
    assert torch.equal(alone[0, 1:], out[2, 6:])
    # and the cache gives what the no-cache path gives
    assert torch.equal(model.generate(t, 8, temperature=0, attention_mask=mask, use_cache=False), out)


def test_chunked_prefill_with_cache():
    model = small(positional_embedding_type="rotary")
    t = tokens(2, 12)
    cache = KVCache(2)
    a = model(t[:, :5], kv_cache=cache)
    b = model(t[:, 5:], kv_cache=cache)
    torch.testing.assert_close(torch.cat((a, b), 1), model(t), atol=1e-5, rtol=0)


def test_sampling_is_seeded_and_respects_top_k():
    model = small()
    t = tokens(2, 4)
    a = model.generate(t, 5, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(3))
    b = model.generate(t, 5, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (2, 9)
    _, logits = model.generate(t, 5, temperature=1.0, top_k=3, generator=torch.Generator().manual_seed(3),
                               return_logits=True)
    top3 = logits.topk(3, dim=-1).indices
    assert (top3 == a[:, 4:, None]).any(-1).all()


def test_post_norm_and_no_norm_models_run():
    for kw in (dict(norm_placement="post"), dict(normalization_type=None), dict(normalization_type="RMS"),
               dict(gated_mlp=True, act_fn="silu"), dict(tie_embeddings=True), dict(dtype="float64")):
        model = small(**kw)
        out = model(tokens())
        assert out.shape == (3, 10, 50) and torch.isfinite(out).all()
