"""harness.model.convert.to_hf: our Transformer as a Hugging Face GPT-2 or Llama, same logits.

Tolerance: float32; the same argument as tests/test_reference_hf.py (O(1-10) values through a
few 32-64-wide reductions done in a different order by the two implementations leave ~1e-6;
atol 1e-4 leaves margin, while a wrong weight, bias, scale or position moves logits by >= 1e-3).
Weights are drawn with a large init range and every 1-D parameter is moved off its init, so a
swapped bias or a forgotten norm gain changes the output.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from harness import ModelConfig, Transformer  # noqa: E402
from harness.model.convert import from_hf, to_hf  # noqa: E402
from harness.model.head_mask import apply_head_mask  # noqa: E402

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
}


def model_for(case: str, seed: int = 0) -> Transformer:
    model = Transformer(ModelConfig(**BASE, **CASES[case], seed=seed))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()


def tokens(batch: int = 3, pos: int = 17) -> torch.Tensor:
    return torch.randint(0, BASE["d_vocab"], (batch, pos), generator=torch.Generator().manual_seed(5))


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
    (dict(positional_embedding_type="sinusoidal"), "positional_embedding_type='sinusoidal'"),
    (dict(positional_embedding_type="none"), "positional_embedding_type='none'"),
    (dict(norm_placement="post"), "norm_placement='post'"),
    (dict(attention_dir="bidirectional"), "attention_dir='bidirectional'"),
    (dict(normalization_type="RMS"), "normalization_type='RMS'"),
    (dict(normalization_type=None), "normalization_type=None"),
    (dict(gated_mlp=True), "gated_mlp=True"),
    (dict(attn_only=True), "attn_only=True"),
    (dict(n_key_value_heads=2), "n_key_value_heads=2"),
    (dict(d_head=16), "d_head=16"),
    (dict(positional_embedding_type="rotary", normalization_type="RMS", gated_mlp=True, use_attn_scale=False),
     "use_attn_scale=False"),
    (dict(positional_embedding_type="rotary", normalization_type="LN", gated_mlp=True), "normalization_type='LN'"),
    (dict(positional_embedding_type="rotary", normalization_type="RMS", gated_mlp=False), "gated_mlp=False"),
])
def test_an_unmappable_config_names_the_field(changes, field):
    model = Transformer(ModelConfig(**{**BASE, **changes}))
    with pytest.raises(ValueError, match="to_hf: " + field.replace("(", r"\(") + " has no"):
        to_hf(model)


def test_bad_arguments():
    with pytest.raises(TypeError, match="harness.Transformer"):
        to_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="target='bert'"):
        to_hf(model_for("gpt2"), target="bert")
