"""harness.model.convert.to_hf: our Transformer as a Hugging Face GPT-2 or Llama, same logits.

GPT-2 exports are checked to the bit (``torch.equal``): both sides run the same kernels (SDPA,
F.layer_norm, F.gelu, the same GEMMs), so any difference is a conversion bug, not rounding. Llama's
rotary and RMSNorm are computed by HF's own code, so Llama keeps a tolerance:
float32; the same argument as tests/test_reference_hf.py (O(1-10) values through a
few 32-64-wide reductions done in a different order by the two implementations leave ~1e-6;
atol 1e-4 leaves margin, while a wrong weight, bias, scale or position moves logits by >= 1e-3).
Weights are drawn with a large init range and every 1-D parameter is moved off its init, so a
swapped bias or a forgotten norm gain changes the output.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from harness import ModelConfig, Transformer
from harness.model.convert import check_exportable, from_hf, to_hf
from harness.model.head_mask import apply_head_mask
from harness.training.presets import preset
from tests.helpers.perturb import perturb_vectors

pytestmark = pytest.mark.usefixtures("one_thread")

ATOL, RTOL = 1e-4, 0.0
BASE = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=50, n_ctx=24, init_range=0.2)
CASES = {
    "gpt2": dict(),
    "gpt2-untied-noscale-relu-nobias": dict(tie_embeddings=False, use_attn_scale=False, act_fn="relu",
                                            attn_bias=False, mlp_bias=False, d_mlp=40),
    "gpt2-tied-gelu": dict(tie_embeddings=True, act_fn="gelu"),
    "llama-gqa": dict(normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
                      act_fn="silu", n_key_value_heads=2, attn_bias=False, mlp_bias=False, rotary_base=500.0),
    "llama-bias-headdim-tied": dict(normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
                                    act_fn="silu", d_head=12, attn_bias=True, mlp_bias=True, tie_embeddings=True),
    # designs that are GPT-2s or Llamas with some weights fixed (see harness/model/convert/to_hf.py)
    "gpt2-attn-only": dict(attn_only=True),
    "gpt2-attn-only-gelu-new-untied": dict(attn_only=True, act_fn="gelu_new", tie_embeddings=False),
    "gpt2-sinusoidal": dict(positional_embedding_type="sinusoidal", act_fn="gelu_new"),
    "gpt2-nope-attn-only": dict(positional_embedding_type="none", attn_only=True),
    "gpt2-gqa": dict(n_key_value_heads=2),
    "llama-attn-only": dict(normalization_type="RMS", positional_embedding_type="rotary", attn_only=True,
                            attn_bias=False),
}
EXACT = sorted(c for c in CASES if c.startswith("gpt2"))


def model_for(case: str, seed: int = 0) -> Transformer:
    return perturb_vectors(Transformer(ModelConfig(**BASE, **CASES[case], seed=seed)), seed + 1)


def tokens(batch: int = 3, pos: int = 17) -> torch.Tensor:
    return torch.randint(0, BASE["d_vocab"], (batch, pos), generator=torch.Generator().manual_seed(5))


def left_padded(pos: int = 17) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens, a left-padding mask (rows padded by 0, 5 and 11) and the positions the protocol gives them
    (real tokens before: our forward derives them from the mask; HF's GPT-2 is told them)."""
    mask = torch.ones(3, pos, dtype=torch.long)
    mask[1, :5] = 0
    mask[2, :11] = 0
    return tokens(3, pos), mask, (mask.cumsum(-1) - 1).clamp(min=0)


def reloaded(hf, folder):
    hf.save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder).eval()  # the default attention, as a user gets it


@pytest.mark.parametrize("case", EXACT)
def test_a_gpt2_export_and_its_reload_compute_our_logits_to_the_bit(case, tmp_path):
    model = model_for(case)
    hf = reloaded(to_hf(model), tmp_path)
    x, mask, positions = left_padded()
    real = mask.bool()  # a padded query's logits are nobody's: HF and we fill its attention row differently
    with torch.no_grad():
        ours, theirs = model(x, attention_mask=mask), hf(x, attention_mask=mask, position_ids=positions).logits
        plain = (model(x), hf(x).logits)
    print(f"{case}: max |HF reload - ours| = {(theirs - ours)[real].abs().max().item()} (left-padded, real tokens), "
          f"{(plain[1] - plain[0]).abs().max().item()} (unpadded)")
    assert torch.equal(theirs[real], ours[real])
    assert torch.equal(*plain)


@pytest.mark.parametrize("case", ["gpt2-attn-only", "gpt2-nope-attn-only", "gpt2-sinusoidal", "llama-attn-only"])
def test_from_hf_of_the_reload_gives_back_the_config_and_the_weights(case, tmp_path):
    model = model_for(case)
    back = from_hf(reloaded(to_hf(model), tmp_path))
    ours, theirs = model.state_dict(), back.state_dict()
    assert sorted(theirs) == sorted(ours)
    assert all(torch.equal(theirs[k], ours[k]) for k in ours), [k for k in ours if not torch.equal(theirs[k], ours[k])]
    design = ("attn_only", "positional_embedding_type", "normalization_type", "d_head", "n_ctx", "tie_embeddings")
    assert {f: getattr(back.config, f) for f in design} == {f: getattr(model.config, f) for f in design}


def test_the_default_preset_exports_losslessly(tmp_path):
    """The demo's model (attention-only, learned positions): the reload's logits and from_hf's weights equal
    ours bit for bit, and the whole config comes back."""
    cfg, _ = preset("induction")
    model = Transformer(cfg.replace(init_range=0.2)).eval()
    hf = reloaded(to_hf(model), tmp_path)
    assert hf.config.n_inner == 1 and not any(p.any() for p in hf.transformer.h[0].mlp.parameters())
    x, mask, positions = left_padded(40)
    with torch.no_grad():
        diff = (hf(x, attention_mask=mask, position_ids=positions).logits - model(x, attention_mask=mask))
    print(f"induction preset: max |HF reload - ours| = {diff[mask.bool()].abs().max().item()}")
    assert not diff[mask.bool()].any()
    eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():  # the bit check can fail: HF's explicit softmax path rounds differently
        assert not torch.equal(eager(x).logits, model(x))
    back = from_hf(hf)
    assert back.config == model.config.replace(init_range=0.2)
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values(), strict=True))


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_has_the_same_logits_and_round_trips(case):
    model = model_for(case)
    hf = to_hf(model)
    assert type(hf).__name__ == ("GPT2LMHeadModel" if case.startswith("gpt2") else "LlamaForCausalLM")
    x = tokens()
    with torch.no_grad():
        ours, theirs = model(x), hf(x).logits
        # from_hf refuses Llama's mlp_bias (HF would bias the gate projection, ours has no such bias)
        back = ours if model.config.gated_mlp and model.config.mlp_bias else from_hf(hf)(x)
    torch.testing.assert_close(theirs, ours, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(back, ours, atol=ATOL, rtol=RTOL)
    trip = "n/a" if back is ours else f"{(back - ours).abs().max():.2e}"
    print(f"{case}: max |HF - ours| = {(theirs - ours).abs().max():.2e}, "
          f"round trip max |from_hf(to_hf) - ours| = {trip}")


@pytest.mark.parametrize("case", ["gpt2", "llama-gqa"])
def test_a_pruned_model_exports_with_its_heads_removed(case):
    model = model_for(case, seed=3)
    apply_head_mask(model, [[1, 0, 1, 0], [0, 1, 1, 1]])
    x = tokens()
    with torch.no_grad():
        unmasked = to_hf(model_for(case, seed=3))(x).logits
        torch.testing.assert_close(to_hf(model)(x).logits, model(x), atol=ATOL, rtol=RTOL)
        assert (unmasked - model(x)).abs().max() > 1e-2  # the mask is not a no-op on this model


@pytest.mark.parametrize(("changes", "field"), [
    (dict(positional_embedding_type="alibi"), "positional_embedding_type='alibi'"),
    (dict(norm_placement="post"), "norm_placement='post'"),
    (dict(attention_dir="bidirectional"), "attention_dir='bidirectional'"),
    (dict(normalization_type="RMS"), "normalization_type='RMS'"),
    (dict(normalization_type=None), "normalization_type=None"),
    (dict(gated_mlp=True), "gated_mlp=True"),
    (dict(attn_only=True, normalization_type="RMS"), "normalization_type='RMS'"),
    (dict(d_head=16), "d_head=16"),
    (dict(positional_embedding_type="rotary", normalization_type="RMS", gated_mlp=True, use_attn_scale=False),
     "use_attn_scale=False"),
    (dict(positional_embedding_type="rotary", normalization_type="LN", gated_mlp=True), "normalization_type='LN'"),
    (dict(positional_embedding_type="rotary", normalization_type="RMS", gated_mlp=False), "gated_mlp=False"),
])
def test_an_unmappable_config_names_the_field(changes, field):
    model = Transformer(ModelConfig(**{**BASE, **changes}))
    pattern = "to_hf: " + field.replace("(", r"\(") + " has no"
    with pytest.raises(ValueError, match=pattern):
        check_exportable(model.config)  # from the config alone, as the demo asks before it trains
    with pytest.raises(ValueError, match=pattern):
        to_hf(model)


def test_bad_arguments():
    with pytest.raises(TypeError, match="harness.Transformer"):
        to_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="target='bert'"):
        to_hf(model_for("gpt2"), target="bert")
