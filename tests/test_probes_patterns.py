"""``probes.attention_patterns`` and the pass runner's ``until``: the patterns ``run_with_cache`` sees, from a pass that
ends at the last one asked for (skip what nobody reads)."""

from __future__ import annotations

import pytest
import torch

import probes
from harness import ModelConfig, Transformer
from harness.adapters import HFAdapter
from harness.errors import AttnlabError, AttnlabTypeError
from probes import gates
from probes._validate import model_info
from tests.helpers.hf_zoo import ZOO, V


def tiny(**overrides) -> Transformer:
    cfg = dict(n_layers=3, d_model=32, n_heads=4, d_vocab=24, n_ctx=16, init_range=0.3, seed=3)
    cfg.update(overrides)
    return Transformer(ModelConfig(**cfg)).eval()


def tokens(n=4, pos=10, d_vocab=24, seed=0):
    return torch.randint(0, d_vocab, (n, pos), generator=torch.Generator().manual_seed(seed))


def cached(model, tok, **kw):
    with torch.no_grad():
        _, cache = model.run_with_cache(tok, names_filter=lambda n: n.endswith("hook_pattern"), **kw)
    return torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(model.cfg.n_layers)])


def calls(module: torch.nn.Module) -> list[int]:
    seen: list[int] = []
    module.register_forward_hook(lambda *_: seen.append(1))
    return seen


@pytest.mark.parametrize("which", ["transformer", "hf llama", "hf gpt2"])
def test_patterns_equal_run_with_cache(which):
    if which == "transformer":
        model, tok = tiny(), tokens()
    else:
        torch.manual_seed(0)
        model, tok = HFAdapter(ZOO[which.split()[1]]().eval()), tokens(d_vocab=V)
    got = probes.attention_patterns(model, tok)
    want = cached(model, tok)
    assert got.shape == want.shape and torch.equal(got, want.float())
    # a subset in the caller's order, and chunked passes: the same numbers to float32 rounding (the batch's
    # blocking of the matmuls differs: a score is a d_head-term dot product, each term off by up to 2^-24
    # relative, and a softmax weight moves by at most its score's error; 1.25e-6 was measured)
    last = model.cfg.n_layers - 1
    sub = probes.attention_patterns(model, tok, layers=[last, 0], batch_size=3)
    rounding = 4 * torch.finfo(torch.float32).eps * model.cfg.d_head * max(1.0, float(want.abs().max()))
    torch.testing.assert_close(sub, want[[last, 0]].float(), rtol=0, atol=rounding)


def test_padded_patterns_equal_run_with_cache():
    model, tok = tiny(), tokens()
    mask = torch.ones_like(tok)
    mask[1, :3] = 0
    got = probes.attention_patterns(model, tok, attention_mask=mask)
    assert torch.equal(got, cached(model, tok, attention_mask=mask))


def test_the_pass_ends_at_the_last_pattern_asked_for():
    """Neither the unembedding nor the layers after the last requested pattern run; without ``until`` they do."""
    model = tiny()
    unembed, last_mlp, mid_mlp = calls(model.unembed), calls(model.blocks[2].mlp), calls(model.blocks[1].mlp)
    probes.attention_patterns(model, tokens(), layers=[1])
    assert (unembed, last_mlp, mid_mlp) == ([], [], [])  # layer 1's own MLP comes after its pattern too
    probes.attention_patterns(model, tokens())
    assert (unembed, last_mlp, mid_mlp) == ([], [], [1])
    info = model_info(model, need_pattern=True)
    out = gates.hooked_pass(model, info, tokens(), None, [("blocks.0.attn.hook_pattern", lambda x, hook: None)])
    assert out.shape == (4, 10, 24) and unembed == [1]


def test_the_models_hooks_are_clean_after_a_stopped_pass():
    model = tiny()
    probes.attention_patterns(model, tokens(), layers=[0])
    assert all(not point.fwd_hooks for point in model.hook_dict.values())
    # and the model still runs whole
    with torch.no_grad():
        assert model(tokens()).shape == (4, 10, 24)


def test_until_must_name_a_hook_of_the_pass():
    model = tiny()
    info = model_info(model, need_pattern=True)
    with pytest.raises(AttnlabError, match="until='blocks.2.attn.hook_pattern' names none of the pass's hooks"):
        gates.hooked_pass(model, info, tokens(), None, [("blocks.0.attn.hook_pattern", lambda x, hook: None)],
                          until="blocks.2.attn.hook_pattern")


@pytest.mark.parametrize("layers, message", [
    ([3], r"layers holds 3: expected integers in \[0, 3\)"),
    ([0, 0], "repeats a layer"),
    ([], "layers is empty"),
    ([True], "layers holds True"),
])
def test_bad_layers_are_refused(layers, message):
    with pytest.raises(AttnlabError, match=message):
        probes.attention_patterns(tiny(), tokens(), layers=layers)


def test_bad_layers_type_is_refused():
    with pytest.raises(AttnlabTypeError, match="layers must be None or a sequence of layer indices, got str"):
        probes.attention_patterns(tiny(), tokens(), layers="0")


def test_a_pattern_hook_that_never_fires_is_named():
    """A model whose layer-1 ``hook_pattern`` is in ``hook_dict`` but never runs: the probes name the layer, for
    ``attention_patterns`` and for the streaming pattern probes alike, and leave no hook behind."""
    model = tiny()
    model.blocks[1].attn.hook_pattern = torch.nn.Identity()  # hook_dict keeps the HookPoint, which no longer runs
    message = r"the pass wrote no pattern for layer\(s\) \[1\]: expected blocks.\{l\}.attn.hook_pattern to fire"
    with pytest.raises(AttnlabError, match=message):
        probes.attention_patterns(model, tokens(), layers=[0, 1])
    with pytest.raises(AttnlabError, match=message):
        probes.attention_entropy(model, tokens())
    assert all(not point.fwd_hooks for point in model.hook_dict.values())
    # the layers that do fire still answer (to float32 rounding: an unhooked layer 1 takes the fused attention path)
    torch.testing.assert_close(probes.attention_patterns(model, tokens(), layers=[2, 0]),
                               cached(tiny(), tokens())[[2, 0]], rtol=0, atol=1e-6)
