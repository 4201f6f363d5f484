"""The zoo (tests/helpers/zoo.py): every failed row of the property suite on a tiny HF model is a documented finding.

Fast tier: GPT-2, Llama, Bloom, BERT and Gemma 2 through HFAdapter and the bridge, the findings'
witnesses, and the design facts whose absence caused false alarms (OPT's pre-scaled q, RoFormer's
sinusoidal rotary, Cohere's interleaved pairs). Slow tier: one run of the whole zoo, every row held to
the same rule, and docs/models.md against it. One test, not one per architecture: under xdist tests of
one module land on both workers, and each worker would run the rows again for itself (each row is a
check_model run; the zoo took ~250 CPU-seconds twice).
"""

from __future__ import annotations

import pytest
import torch

from properties import PROPERTIES
from tests.helpers import zoo
from tests.helpers.zoo_witness import WITNESSES

pytestmark = pytest.mark.usefixtures("one_thread")
_ROWS: dict[tuple[str, str], zoo.ZooRow] = {}  # shared by the per-architecture tests and the docs test


def _row(arch: str, adapter: str) -> zoo.ZooRow:
    if (arch, adapter) not in _ROWS:
        _ROWS[(arch, adapter)] = zoo.run(arch, adapter)
    return _ROWS[(arch, adapter)]


def _problems(arch: str, adapter: str) -> list[str]:
    """What is wrong with the zoo row of ``arch`` behind ``adapter``: nothing, for a row whose every failure is
    a documented finding that still reproduces in the suite (a fix upstream is a problem: drop the finding)."""
    row = _row(arch, adapter)
    if adapter != "bridge" and row.error:
        return [f"error: {row.error}"]
    out = []
    if row.undocumented:
        out.append(f"undocumented failures: {[f for f in row.failures if f[0] in row.undocumented]}")
    failed, documented = {p for p, _, _ in row.failures}, set(zoo.findings_for(arch, adapter))
    if failed != documented:
        out.append(f"failed {sorted(failed)}, documented {sorted(documented)}")
    if not row.error and (sum(row.counts.values()) != len(PROPERTIES) or row.counts["pass"] == 0):
        out.append(f"counts {row.counts}")
    return out


@pytest.mark.parametrize(("arch", "adapter"), [(a, ad) for a in zoo.FAST for ad in zoo.ADAPTERS])
def test_every_failed_row_is_a_documented_finding(arch, adapter):
    assert not _problems(arch, adapter)


@pytest.mark.parametrize("finding", zoo.FINDINGS, ids=lambda f: f"{f.arch}-{f.adapter}-{f.prop}")
def test_finding_reproduces_without_the_suite(finding):
    seen = WITNESSES[finding.witness]()  # raises AssertionError once the bug is fixed
    assert isinstance(seen, str) and seen


def test_zoo_size_and_fast_tier():
    assert len(zoo.ZOO) >= 25 and set(zoo.FAST) <= set(zoo.ZOO)
    with pytest.raises(ValueError, match="not in the zoo"):
        zoo.build("t5")
    with pytest.raises(ValueError, match="adapter="):
        zoo.adapted("gpt2", "nnsight")


def test_opt_declares_its_prescaled_query():
    """OPT computes q_proj(x) * scaling and calls its kernel with scaling=1.0: hook_q is the scaled q."""
    from harness.adapters import BridgeAdapter, HFAdapter

    adapter = HFAdapter(zoo.build("opt"))
    d_head = adapter.cfg.d_head
    assert adapter.cfg.attn_scales == (1.0, 1.0) and adapter.cfg.query_prescale == pytest.approx(d_head ** -0.5)
    _, cache = adapter.run_with_cache(torch.tensor([[3, 5, 7]]))
    q, k = cache["blocks.0.attn.hook_q"][0, :, 0], cache["blocks.0.attn.hook_k"][0, :, 0]
    # independent: the module's own projections, scaled by hand, as modeling_opt.py does
    attn = adapter._attns[0]
    hidden = adapter.hf_model.model.decoder.layers[0].self_attn_layer_norm(cache["blocks.0.hook_resid_pre"])
    torch.testing.assert_close(q, (attn.q_proj(hidden) * attn.scaling)[0, :, :d_head], atol=1e-6, rtol=0)
    torch.testing.assert_close(k, attn.k_proj(hidden)[0, :, :d_head], atol=1e-6, rtol=0)
    # the bridge's hook_q is the projection's output: the whole scale is declared on it
    assert BridgeAdapter.from_hf(zoo.build("opt")).cfg.attn_scales == pytest.approx((d_head ** -0.5,) * 2)


def test_roformer_is_rotary_and_takes_a_position_offset():
    """RoFormer's sinusoidal table gives the angles of a rotation of q and k (Su et al. 2021), interleaved pairs."""
    from harness.adapters import HFAdapter

    model = zoo.build("roformer")
    plain = zoo.build("roformer")
    adapter = HFAdapter(model)
    assert (adapter.cfg.positional_embedding_type, adapter.cfg.rotary_style) == ("rotary", "interleaved")
    x = torch.tensor([[3, 5, 7, 9]])
    with torch.no_grad():
        ref = plain(input_ids=x).logits
        torch.testing.assert_close(adapter(x), ref, atol=1e-5, rtol=0)
        # relative positions: an offset moves every angle alike (the model's own table computes them)
        torch.testing.assert_close(adapter(x, position_offset=5), ref, atol=1e-5, rtol=0)
        table = plain.roformer.encoder.embed_positions
        shifted = table(x.shape, position_ids=torch.arange(5, 9))
        assert not torch.equal(shifted, table(x.shape))  # the offset really reached different angles


def test_cohere_declares_interleaved_pairs():
    from harness.adapters import HFAdapter

    assert HFAdapter(zoo.build("cohere")).cfg.rotary_style == "interleaved"
    assert HFAdapter(zoo.build("llama")).cfg.rotary_style == "half"


@pytest.mark.long
@pytest.mark.slow
def test_every_row_of_the_whole_zoo_is_documented_and_docs_models_md_is_their_table():
    problems = {f"{a}-{ad}": p for a in sorted(zoo.ZOO) for ad in zoo.ADAPTERS if (p := _problems(a, ad))}
    assert not problems, problems
    rows = [_row(a, ad) for a in sorted(zoo.ZOO) for ad in zoo.ADAPTERS]
    text = zoo.DOC.read_text()
    assert zoo.render_doc(rows, text) == text, "docs/models.md is stale: run python -m tests.helpers.zoo"
    assert "failed rows that are not: **0**" in text


def test_kv_cache_decodes_through_the_models_own_cache():
    """HFAdapter.forward_with_cache feeds only the new tokens with the model's cache: equal to a full forward."""
    import properties
    from harness.adapters import HFAdapter

    adapter = HFAdapter(zoo.build("llama"))
    x = torch.tensor([[0, 3, 5], [4, 6, 8]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # left-padded prompt
    with torch.no_grad():
        prompt, past = adapter.forward_with_cache(x, attention_mask=mask)
        step, past = adapter.forward_with_cache(torch.tensor([[7], [9]]), past=past)
        full = adapter(torch.cat((x, torch.tensor([[7], [9]])), 1), attention_mask=torch.cat((mask, torch.ones(2, 1,
                                                                                     dtype=torch.long)), 1))
    assert past[0].get_seq_length() == 4  # the model's own cache holds every position
    torch.testing.assert_close(step[:, -1], full[:, -1], atol=1e-5, rtol=0)
    row = properties.check_model(adapter, properties=["kv_cache"], max_examples=5).iloc[0]
    assert row.status == "pass" and "forward_with_cache" in row.reason
    assert not hasattr(HFAdapter(zoo.build("bert")), "forward_with_cache")  # bidirectional: nothing to decode
