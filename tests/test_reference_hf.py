"""harness.model.convert.from_hf against Hugging Face GPT-2 and Llama, the independent reference.

Small random HF models are built from configs in memory (no network). Weights are drawn with
a large init range and every 1-D parameter (norm gains, biases) is perturbed away from its
init, so a swapped bias, a mis-ordered head or a forgotten norm gain changes the output.

Tolerance: float32 throughout. Values are O(1-10) and pass through a few layers of 64-wide
reductions done in a different order by the two implementations (SDPA vs matmul, fused vs
separate projections), which leaves differences of ~1e-6; atol 1e-4 leaves a wide margin for
that, while any real mismatch (a wrong weight, scale, eps or position) moves values by >= 1e-3.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

from harness.model.convert import SUPPORTED, from_hf  # noqa: E402
from tests.helpers.perturb import perturb_vectors  # noqa: E402

ATOL, RTOL = 1e-4, 0.0  # see the module docstring
VOCAB, SEQ = 100, 12
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def gpt2(seed: int = 0, **overrides) -> GPT2LMHeadModel:
    kw = dict(n_layer=3, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=32, initializer_range=0.2,
              attn_implementation="eager", **NO_SPECIAL)
    kw.update(overrides)
    torch.manual_seed(seed)
    return perturb_vectors(GPT2LMHeadModel(GPT2Config(**kw)), seed + 1)


def llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    kw = dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, vocab_size=VOCAB, max_position_embeddings=64, initializer_range=0.2,
              attention_bias=True, attn_implementation="eager", **NO_SPECIAL)
    kw.update(overrides)
    torch.manual_seed(seed)
    return perturb_vectors(LlamaForCausalLM(LlamaConfig(**kw)), seed + 1)


CASES = {
    "gpt2": lambda: gpt2(),
    "gpt2-untied-noscale-reorder": lambda: gpt2(1, tie_word_embeddings=False, scale_attn_weights=False,
                                                reorder_and_upcast_attn=True, n_inner=80),
    "llama-gqa": lambda: llama(),
    "llama-tied-headdim-theta": lambda: llama(2, num_key_value_heads=1, head_dim=24, tie_word_embeddings=True,
                                             attention_bias=False, rope_parameters={"rope_type": "default",
                                                                                    "rope_theta": 500000.0}),
    "llama-mha-gelu": lambda: llama(3, num_key_value_heads=4, hidden_act="gelu"),
}


def tokens(batch: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Left padding of 0, 3 and 7 tokens; pad ids are arbitrary real ids (they must not matter)."""
    mask = torch.ones(3, SEQ, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :7] = 0
    return tokens(seed=1), mask


def hf_run(hf, toks, mask=None):
    kwargs = {}
    if mask is not None:
        # Our rule is that positions count real tokens only; HF takes explicit position ids.
        kwargs = dict(attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    with torch.no_grad():
        return hf(toks, output_hidden_states=True, output_attentions=True, **kwargs)


def our_run(model, toks, mask=None):
    n = model.config.n_layers
    names = {f"blocks.{i}.hook_resid_pre" for i in range(n)} | {f"blocks.{i}.attn.hook_pattern" for i in range(n)}
    names.add("ln_final.hook_normalized")
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks, attention_mask=mask, names_filter=lambda name: name in names)
    return logits, cache


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_hf(case):
    hf = CASES[case]()
    model = from_hf(hf)
    toks = tokens()
    with torch.no_grad():
        ours, theirs = model(toks), hf(toks).logits  # unhooked: our SDPA fast path
    diff = (ours - theirs).abs().max().item()
    print(f"\n{case}: max abs logit diff vs HF = {diff:.3e} (logit scale {theirs.abs().max().item():.2f})")
    assert theirs.std() > 0.1  # the comparison is not between near-constant outputs
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("case", ["gpt2", "llama-gqa", "llama-tied-headdim-theta"])
def test_hidden_states_and_patterns_match_hf(case):
    hf = CASES[case]()
    model = from_hf(hf)
    toks = tokens()
    out = hf_run(hf, toks)
    logits, cache = our_run(model, toks)
    n = model.config.n_layers
    torch.testing.assert_close(logits, out.logits, atol=ATOL, rtol=RTOL)  # hooked: explicit path
    # transformers 5 returns n_layers + 1 hidden states: hidden_states[i] (i < n) is the input of
    # layer i, and the last one is replaced by the final-normed output (capture_outputs ties it
    # to last_hidden_state), so it maps to ln_final's output, not to the last resid_post.
    assert len(out.hidden_states) == n + 1
    for i in range(n):
        torch.testing.assert_close(cache[f"blocks.{i}.hook_resid_pre"], out.hidden_states[i], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(cache["ln_final.hook_normalized"], out.hidden_states[n], atol=ATOL, rtol=RTOL)
    assert len(out.attentions) == n
    for i in range(n):
        pattern = cache[f"blocks.{i}.attn.hook_pattern"]
        torch.testing.assert_close(pattern, out.attentions[i], atol=ATOL, rtol=RTOL)
        # the patterns are far from uniform, so this comparison has teeth
        assert pattern.max() > 0.5


@pytest.mark.parametrize("case", ["gpt2", "llama-gqa"])
def test_left_padded_batch_matches_hf(case):
    hf = CASES[case]()
    model = from_hf(hf)
    toks, mask = padded_batch()
    out = hf_run(hf, toks, mask)
    logits, cache = our_run(model, toks, mask)
    real = mask.bool()  # padded positions are undefined in both models: compare real ones only
    torch.testing.assert_close(logits[real], out.logits[real], atol=ATOL, rtol=RTOL)
    for i in range(model.config.n_layers):
        torch.testing.assert_close(cache[f"blocks.{i}.hook_resid_pre"][real], out.hidden_states[i][real],
                                   atol=ATOL, rtol=RTOL)
        pattern = cache[f"blocks.{i}.attn.hook_pattern"].transpose(1, 2)[real]  # [real queries, heads, keys]
        torch.testing.assert_close(pattern, out.attentions[i].transpose(1, 2)[real], atol=ATOL, rtol=RTOL)
    # and a real query puts exactly zero weight on padded keys
    weight_on_pad = cache["blocks.0.attn.hook_pattern"].masked_fill(real[:, None, None, :], 0).sum(-1)
    assert (weight_on_pad.transpose(1, 2)[real] == 0).all()


def test_padding_does_not_move_positions():
    """The last row of the padded batch, unpadded and alone, gives the same logits in both models."""
    hf = CASES["llama-gqa"]()
    model = from_hf(hf)
    toks, mask = padded_batch()
    alone = toks[2:3, 7:]
    with torch.no_grad():
        torch.testing.assert_close(model(toks, attention_mask=mask)[2, 7:], model(alone)[0], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(model(alone), hf(alone).logits, atol=ATOL, rtol=RTOL)


def test_result_dtype_and_mode():
    hf = gpt2()
    hf.train()
    model = from_hf(hf)
    assert not model.training and model.W_E.dtype == torch.float32
    assert model.config.eps == hf.config.layer_norm_epsilon and model.config.n_ctx == 32
    # float64 stays float64; GPT-2 then agrees far more tightly (float64 rounding only). HF Llama
    # computes RMSNorm and the rotary angles in float32 even in a float64 model, so it keeps ATOL.
    for make, atol in ((gpt2, 1e-10), (llama, ATOL)):
        hf64 = make().double()
        model64 = from_hf(hf64)
        assert model64.W_E.dtype == torch.float64
        with torch.no_grad():
            torch.testing.assert_close(model64(tokens()), hf64(tokens()).logits, atol=atol, rtol=0)
    # half precision is upcast to float32 exactly: the same model as converting the upcast source
    hf16 = llama().to(torch.bfloat16)
    model16 = from_hf(hf16)
    assert model16.W_E.dtype == torch.float32
    reference = from_hf(hf16.float())
    for (name, a), (_, b) in zip(model16.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_conversion_does_not_change_the_hf_model():
    hf = gpt2()
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    from_hf(hf)
    assert all(torch.equal(before[k], v) for k, v in hf.state_dict().items())


# --- refusals ----------------------------------------------------------------------------

def test_non_module_is_a_type_error():
    with pytest.raises(TypeError, match="str"):
        from_hf("gpt2")


@pytest.mark.parametrize("make", [
    lambda: GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, **NO_SPECIAL)),
    lambda: GPTNeoXForCausalLM(GPTNeoXConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                             intermediate_size=64, vocab_size=VOCAB, **NO_SPECIAL)),
    lambda: torch.nn.Linear(3, 3),
])
def test_unsupported_architecture_names_class_and_supported_ones(make):
    module = make()
    with pytest.raises(ValueError) as err:
        from_hf(module)
    msg = str(err.value)
    assert type(module).__name__ in msg
    assert all(name in msg for name in SUPPORTED)


@pytest.mark.parametrize("make, field", [
    (lambda: gpt2(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    (lambda: gpt2(add_cross_attention=True), "add_cross_attention"),
    (lambda: gpt2(activation_function="quick_gelu"), "activation_function"),
    (lambda: llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), "rope_type"),
    (lambda: llama(mlp_bias=True), "mlp_bias"),
    (lambda: llama(hidden_act="gelu_fast"), "hidden_act"),
])
def test_unreproducible_config_is_refused(make, field):
    hf = make()
    with pytest.raises(ValueError, match=field):
        from_hf(hf)


def test_tied_config_with_untied_weights_is_refused():
    hf = gpt2()
    hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach() + 1.0)
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        from_hf(hf)
