"""HFAdapter on tiny random Hugging Face models built from configs in memory (no network).

Tolerances: the adapter calls the model's own forward with the model's own kernel, so logits are
compared at atol 1e-5 (float32; measured differences are 0). The explicit path (pattern @ v,
taken when a hook edits scores, pattern or grouped K/V) sums in a different order than sdpa:
~d_head * 2^-24 relative per layer, so 1e-5 again.
"""

from __future__ import annotations

import copy
import inspect
from types import SimpleNamespace

import pytest
import torch
import transformers as tr

from harness.adapters import BridgeAdapter, DesignFacts, HFAdapter, adapt, check_protocol
from harness.adapters import hf_attention as attention
from harness.adapters.design_facts import design_facts

pytestmark = pytest.mark.usefixtures("one_thread")
V = 64
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def build(arch: str, **extra) -> torch.nn.Module:
    c = dict(vocab_size=V, max_position_embeddings=64)
    makers = {
        "gpt2": lambda: tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                                          bos_token_id=0, eos_token_id=0, **extra)),
        "llama": lambda: tr.LlamaForCausalLM(tr.LlamaConfig(**c, **SMALL, num_key_value_heads=2, **extra)),
        "qwen3": lambda: tr.Qwen3ForCausalLM(tr.Qwen3Config(**c, **SMALL, num_key_value_heads=2, head_dim=8)),
        "mistral": lambda: tr.MistralForCausalLM(tr.MistralConfig(**c, **SMALL, num_key_value_heads=2,
                                                                  sliding_window=4)),
        "gemma2": lambda: tr.Gemma2ForCausalLM(tr.Gemma2Config(**c, **SMALL, num_key_value_heads=2, head_dim=8,
                                                               sliding_window=4, query_pre_attn_scalar=16)),
        "gpt_neox": lambda: tr.GPTNeoXForCausalLM(tr.GPTNeoXConfig(**c, **SMALL)),
        "opt": lambda: tr.OPTForCausalLM(tr.OPTConfig(**c, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                                      num_attention_heads=4, word_embed_proj_dim=32)),
        "bloom": lambda: tr.BloomForCausalLM(tr.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4)),
        "bert": lambda: tr.BertForMaskedLM(tr.BertConfig(**c, **SMALL)),
        "gptj": lambda: tr.GPTJForCausalLM(tr.GPTJConfig(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                                         rotary_dim=4, bos_token_id=0, eos_token_id=0)),
    }
    torch.manual_seed(0)
    return makers[arch]().eval()


def tokens_and_mask() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, V, (2, 7), generator=g)
    mask = torch.ones_like(x)
    mask[1, :3] = 0  # left padding
    return x, mask


def hf_logits(model: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """The model's own forward with the protocol's positions (offset + real tokens before each token)."""
    kwargs = {}
    if "position_ids" in inspect.signature(model.forward).parameters:
        kwargs["position_ids"] = offset + (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=x, attention_mask=mask, **kwargs).logits


def assert_same_logits(plain: torch.nn.Module, adapter: HFAdapter, offset: int = 0) -> None:
    x, mask = tokens_and_mask()
    ref = hf_logits(plain, x, mask, offset)
    with torch.no_grad():
        got = adapter(x, attention_mask=mask, position_offset=offset)
    real = mask.bool()  # a padded position's logits are not defined by the protocol
    torch.testing.assert_close(got[real], ref[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch,route", [("gpt2", "attention_interface"), ("llama", "attention_interface"),
                                        ("gemma2", "attention_interface"), ("bloom", "module_hooks"),
                                        ("bert", "attention_interface")])
def test_logits_equal_the_models_own_forward(arch, route):
    model = build(arch)
    plain = copy.deepcopy(model)
    adapter = HFAdapter(model)
    assert adapter.route == route
    assert_same_logits(plain, adapter)


def test_position_offset_moves_positions_like_position_ids():
    model = build("llama")
    plain = copy.deepcopy(model)
    assert_same_logits(plain, HFAdapter(model), offset=5)


def test_hooks_fire_with_protocol_shapes():
    adapter = HFAdapter(build("llama"))  # grouped-query: 4 query heads, 2 key/value heads
    x, mask = tokens_and_mask()
    _, cache = adapter.run_with_cache(x, attention_mask=mask)
    b, p, h, d = 2, 7, 4, 8
    expected = {"hook_q": (b, p, h, d), "hook_k": (b, p, h, d), "hook_v": (b, p, h, d), "hook_rot_q": (b, p, h, d),
                "hook_rot_k": (b, p, h, d), "hook_z": (b, p, h, d), "hook_attn_scores": (b, h, p, p),
                "hook_pattern": (b, h, p, p)}
    for layer in range(2):
        for name, shape in expected.items():
            assert tuple(cache[f"blocks.{layer}.attn.{name}"].shape) == shape, name
        for name in ("hook_resid_pre", "hook_resid_post", "hook_attn_out"):
            assert tuple(cache[f"blocks.{layer}.{name}"].shape) == (b, p, 32), name
    assert tuple(cache["hook_embed"].shape) == (b, p, 32)
    pattern = cache["blocks.0.attn.hook_pattern"]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(b, h, p), atol=1e-6, rtol=0)
    real_rows = pattern * mask[:, None, :, None]  # a fully padded query's row is not defined by the protocol
    assert float(real_rows.triu(1).abs().max()) == 0.0  # causal
    assert float(pattern[1, :, 3:, :3].abs().max()) == 0.0  # real queries never see the left padding
    # pre-rotation q differs from the rotated q but has the same per-pair norms (rotation, Su et al. 2021)
    q, rq = cache["blocks.0.attn.hook_q"], cache["blocks.0.attn.hook_rot_q"]
    assert not torch.allclose(q[:, 1:], rq[:, 1:])
    torch.testing.assert_close(q.norm(dim=-1), rq.norm(dim=-1), atol=1e-5, rtol=0)


def test_scores_are_the_scaled_dot_products_the_model_uses():
    adapter = HFAdapter(build("gemma2"))  # scale query_pre_attn_scalar**-0.5, soft-capped at 50
    x, _ = tokens_and_mask()
    _, cache = adapter.run_with_cache(x)
    q, k = cache["blocks.1.attn.hook_rot_q"], cache["blocks.1.attn.hook_rot_k"]
    raw = torch.einsum("bqhd,bkhd->bhqk", q, k) * adapter.cfg.attn_scales[1]
    cap = adapter.cfg.attn_softcap
    expected = torch.tanh(raw / cap) * cap
    scores = cache["blocks.1.attn.hook_attn_scores"]
    allowed = torch.ones(7, 7, dtype=torch.bool).tril()
    torch.testing.assert_close(scores[..., allowed], expected[..., allowed], atol=1e-5, rtol=0)
    assert float(scores[..., ~allowed].max()) <= -1e4


@pytest.mark.parametrize("arch,out_proj", [("llama", "self_attn.o_proj"), ("bloom", "self_attention.dense")])
def test_gating_hook_z_equals_a_hand_made_ablation(arch, out_proj):
    model = build(arch)
    plain = copy.deepcopy(model)
    adapter = HFAdapter(model)
    layer, head, d = 1, 2, 8
    x, mask = tokens_and_mask()

    def zero_head(z, hook):
        z = z.clone()
        z[:, :, head] = 0
        return z

    with torch.no_grad():
        gated = adapter.run_with_hooks(x, attention_mask=mask, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head)])
    block = plain.model.layers[layer] if arch == "llama" else plain.transformer.h[layer]
    proj = block.get_submodule(out_proj)

    def zero_slice(module, args):
        merged = args[0].clone()
        merged[..., head * d:(head + 1) * d] = 0
        return (merged,)

    handle = proj.register_forward_pre_hook(zero_slice)
    try:
        ref = hf_logits(plain, x, mask)
    finally:
        handle.remove()
    real = mask.bool()
    torch.testing.assert_close(gated[real], ref[real], atol=1e-5, rtol=0)
    assert float((gated - hf_logits(plain, x, mask))[real].abs().max()) > 1e-4  # the ablation did something


def test_a_patched_modeling_file_stays_visible(monkeypatch):
    from transformers.models.llama import modeling_llama

    model = build("llama")
    plain = copy.deepcopy(model)
    adapter = HFAdapter(model)
    x, mask = tokens_and_mask()
    with torch.no_grad():
        before = adapter(x, attention_mask=mask)
    # a user's bug in the rotary helper: rotate_half forgets the sign
    monkeypatch.setattr(modeling_llama, "rotate_half", lambda t: torch.cat((t[..., t.shape[-1] // 2:],
                                                                            t[..., : t.shape[-1] // 2]), dim=-1))
    assert_same_logits(plain, adapter)
    with torch.no_grad():
        after = adapter(x, attention_mask=mask)
    assert float((after - before)[mask.bool()].abs().max()) > 1e-4  # the bug shows in the adapter's logits


def test_idle_and_observing_hooks_keep_the_kernel_and_edits_reach_the_output():
    model = build("llama")
    plain = copy.deepcopy(model)
    adapter = HFAdapter(model)
    taps = [t for t in attention.TAPS.values() if t in adapter._taps]
    x, mask = tokens_and_mask()
    with torch.no_grad():
        adapter.run_with_hooks(x, attention_mask=mask, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: None)])
    assert sum(t.explicit_calls for t in taps) == 0  # only hooks on scores/pattern need the explicit path
    with torch.no_grad():
        adapter.run_with_hooks(x, attention_mask=mask, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: None)])
    assert [t.explicit_calls for t in taps] == [1, 0]
    # an edit that changes nothing (a copy) takes the explicit path for the output: it must equal the kernel's
    real = mask.bool()
    ref = hf_logits(plain, x, mask)
    for name in ("hook_pattern", "hook_attn_scores", "hook_rot_k", "hook_v"):
        with torch.no_grad():
            got = adapter.run_with_hooks(x, attention_mask=mask,
                                         fwd_hooks=[(f"blocks.1.attn.{name}", lambda t, hook: t.clone())])
        torch.testing.assert_close(got[real], ref[real], atol=1e-5, rtol=0, msg=name)


def test_declared_design():
    gemma = HFAdapter(build("gemma2")).cfg
    assert gemma.arch == "gemma2" and gemma.adapter == "HFAdapter"
    assert gemma.attn_scale == pytest.approx(16 ** -0.5) and gemma.attn_softcap == 50.0
    assert gemma.sliding_window == (4, None) and gemma.positional_embedding_type == "rotary"
    assert (gemma.n_heads, gemma.n_key_value_heads, gemma.d_head) == (4, 2, 8)
    mistral = HFAdapter(build("mistral")).cfg
    assert mistral.sliding_window == (4, 4) and mistral.rotary_style == "half" and mistral.rotary_dim == 8
    neox = HFAdapter(build("gpt_neox")).cfg
    assert neox.rotary_dim == 2 and neox.rotary_base == 10000.0  # rotary_pct 0.25 of d_head 8
    opt = HFAdapter(build("opt")).cfg
    assert opt.pos_offset == 2 and opt.positional_embedding_type == "standard"
    bloom = HFAdapter(build("bloom")).cfg
    assert bloom.alibi and bloom.alibi_style == "absolute_key" and bloom.positional_embedding_type == "alibi"
    gptj = HFAdapter(build("gptj")).cfg
    assert gptj.rotary_style == "interleaved" and gptj.rotary_dim == 4
    bert = HFAdapter(build("bert")).cfg
    assert bert.attention_dir == "bidirectional" and bert.positional_embedding_type == "standard"
    qwen3 = HFAdapter(build("qwen3")).cfg
    assert qwen3.qk_norm and not gemma.alibi
    gpt2 = HFAdapter(build("gpt2", scale_attn_by_inverse_layer_idx=True)).cfg
    assert gpt2.attn_scales == pytest.approx((8 ** -0.5, 8 ** -0.5 / 2))


def test_adapt_dispatches_and_reuses_the_adapter():
    model = build("gpt2")
    adapter = adapt(model)
    assert isinstance(adapter, HFAdapter) and adapt(model) is adapter and adapt(adapter) is adapter
    plain = torch.nn.Linear(2, 2)
    assert adapt(plain) is plain  # not adaptable: the entry point's protocol check refuses it
    with pytest.raises(TypeError, match="not a transformer_lens.HookedRootModule"):
        check_protocol(adapt(plain))


def test_bad_models_get_one_error():
    t5 = tr.T5ForConditionalGeneration(tr.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                                   num_heads=4, decoder_start_token_id=0))
    with pytest.raises(TypeError, match=r"architecture 't5'.*supported architectures: .*llama"):
        HFAdapter(t5)
    with pytest.raises(TypeError, match="expects a transformers.PreTrainedModel"):
        HFAdapter(torch.nn.Linear(2, 2))
    model = build("llama")

    def broken(*args, **kwargs):
        raise RuntimeError("user bug")

    model.model.layers[0].mlp.forward = broken
    with pytest.raises(ValueError, match="raised RuntimeError on a plain 2-token input: user bug"):
        HFAdapter(model)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_both_adapters_declare_the_same_design_facts(arch):
    """One DesignFacts, filled by both adapters from the same reader: the bridge declares what HFAdapter does."""
    hf = HFAdapter(build(arch)).cfg
    bridge = BridgeAdapter.from_hf(build(arch)).cfg
    assert isinstance(hf, DesignFacts) and isinstance(bridge, DesignFacts)
    assert (hf.adapter, bridge.adapter) == ("HFAdapter", "BridgeAdapter")
    assert design_facts(bridge) == design_facts(hf)
    assert hf.rope_type == ("default" if arch == "llama" else None)


def test_the_bridge_folds_a_query_prescale_into_its_scale():
    # OPT multiplies q_proj(x) by d_head**-0.5 before attention: HFAdapter's hook_q is already scaled (scale 1),
    # a bridge's hook_q is the raw projection, so the whole scale is the factor on it
    hf = HFAdapter(build("opt")).cfg
    assert hf.attn_scales == (1.0, 1.0) and hf.query_prescale == pytest.approx(8 ** -0.5)
    bridge_cfg = SimpleNamespace(n_layers=2, n_heads=4, d_head=8, d_model=32, d_vocab=V, n_ctx=64,
                                 positional_embedding_type="standard", attention_dir="causal")
    folded = BridgeAdapter._read_cfg(bridge_cfg, hf)
    assert folded.attn_scales == pytest.approx((8 ** -0.5,) * 2) and folded.attn_scale == pytest.approx(8 ** -0.5)
    assert folded.query_prescale is None
    expected = {**design_facts(hf), "attn_scale": folded.attn_scale, "attn_scales": folded.attn_scales,
                "query_prescale": None}
    assert design_facts(folded) == expected  # every other fact as HFAdapter read it
