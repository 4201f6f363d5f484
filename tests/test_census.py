"""The census (reports/census): enumeration, the generic shrink, one result per model type, the cache, the docs.

Fast tier: a handful of model types, one per category the census reaches cheaply, and the docs
against the stored results (docs/census.json: no model is built). Slow tier: a sharded run over two
workers reproduces the stored categories.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import transformers

from harness.adapters import HFAdapter
from harness.errors import AttnlabError
from reports.census import classify as classify_mod
from reports.census import command, executor, render, run, shrink
from reports.census.classify import CATEGORIES, Result, classify
from reports.census.enumerate import MAPPINGS, by_name, model_types
from reports.census.findings import FINDINGS
from tests.helpers.census_witness import WITNESSES

pytestmark = pytest.mark.usefixtures("one_thread")
STORED = Path(__file__).resolve().parents[1] / "docs" / "census.json"


def test_every_model_type_of_the_auto_mappings_once():
    types = model_types()
    names = [m.name for m in types]
    assert len(names) == len(set(names)) >= 200
    assert set(names) == {n for mapping in MAPPINGS.values() for n in mapping}
    bart = by_name()["bart"]
    assert bart.task == "causal_lm" and "seq2seq_lm" in bart.tasks  # the causal head first


def test_shrink_keeps_one_layer_of_each_type_and_moves_special_ids():
    d = {"num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "layer_types": ["sliding_attention"] * 5 + ["full_attention"] * 31, "vocab_size": 262144,
         "eos_token_id": 262143, "pad_token_id": 0, "sliding_window": 4096, "num_experts": 128,
         "num_experts_per_tok": 8, "attn_logit_softcapping": 50.0, "per_layer": {"3": 1, "30": 2}}
    new = shrink.shrink_dict(d)
    assert new["num_hidden_layers"] == 6 and new["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert (new["hidden_size"], new["num_attention_heads"], new["num_key_value_heads"]) == (64, 4, 2)
    assert new["vocab_size"] == 128 and 0 <= new["eos_token_id"] < 128 and new["pad_token_id"] == 0
    assert (new["sliding_window"], new["num_experts"], new["num_experts_per_tok"]) == (8, 4, 2)
    assert new["attn_logit_softcapping"] == 50.0 and new["per_layer"] == {"3": 1}  # structure kept


def test_tiny_causal_head_on_a_bert_style_stack_is_a_decoder():
    assert shrink.tiny_config("bert", "BertLMHeadModel").is_decoder is True
    assert shrink.tiny_config("bert", "BertForMaskedLM").is_decoder is False


@pytest.mark.parametrize(("model_type", "category"), [("llama", "clean"), ("mamba", "no attention"),
                                                      ("bloom", "unobservable"), ("deepseek_v4", "finding")])
def test_one_result_per_category(model_type, category):
    result = classify(by_name()[model_type])
    assert result.category == category, result
    assert result.reason and result.category in CATEGORIES
    if category in ("clean", "unobservable", "finding"):
        assert result.rows and result.route and "hook_resid_pre" in result.hooks
    if category == "finding":
        assert set(result.failures) <= {f.prop for f in FINDINGS if f.model_type == model_type} and result.failures


def test_an_encoder_decoder_is_checked_through_its_cross_attention_route():
    result = classify(by_name()["t5"])
    assert result.category == "clean" and result.rows["cross_attention_pattern"] == "pass", result
    assert "cross_attn.hook_pattern" in result.hooks and "encoder.hook_embed" in result.hooks, result.hooks


def test_a_config_that_cannot_be_built_is_a_row_not_a_crash(monkeypatch):
    monkeypatch.setitem(shrink.HAND, "llama", ({"num_attention_heads": 5}, "test: 64 is not divisible by 5"))
    result = classify(by_name()["llama"])
    assert result.category == "unsupported" and "cannot build a tiny LlamaForCausalLM" in result.reason


def test_a_timeout_is_recorded_with_its_stage(monkeypatch):
    def slow(mt, result):
        result.stage = "check"
        time.sleep(5)

    monkeypatch.setattr(run, "classify", slow)
    executor.init_worker()
    result = run.run_one(by_name()["llama"], timeout_s=1)
    assert result["category"] == "unsupported" and "timed out after 1s at stage 'check'" in result["reason"]


def test_cached_results_are_not_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    types = [by_name()["mamba"]]
    first = run.census(types, workers=1)
    assert (run.cache_dir() / "mamba.json").exists() and first[0].category == "no attention"
    monkeypatch.setattr(executor.LocalPool, "map",
                        lambda self, work, todo, *a: pytest.fail("rebuilt a cached result") if todo else iter(()))
    assert run.census(types, workers=1)[0] == first[0]
    assert run.cache_key().startswith("transformers-")


def test_only_an_unknown_type_lists_close_matches():
    with pytest.raises(AttnlabError, match="'lama'.*close matches: .*llama"):
        command.select(("lama",))
    assert [m.name for m in command.select(("gpt2",))] == ["gpt2"]


def test_docs_are_the_stored_census():
    """docs/models.md's census section is rendered from docs/census.json (no model is built here)."""
    stored = json.loads(STORED.read_text())
    results = [Result.from_json(r) for r in stored["results"]]
    text = command.DOC.read_text()
    section = render.census_section(results, stored["transformers"], stored["wall"])
    assert section in text, "docs/models.md is stale: run attnlab census --write-docs"
    assert {r.model_type for r in results} == {m.name for m in model_types()} or \
        stored["transformers"] != transformers.__version__
    assert render.summary_line(results) in text and (command.DOC.parent / render.FIGURE).exists()


@pytest.mark.parametrize("finding", FINDINGS, ids=lambda f: f"{f.model_type}-{f.prop}")
def test_census_finding_reproduces_without_the_suite(finding):
    assert WITNESSES[finding.witness](finding.model_type)  # raises AssertionError once the bug is fixed


@pytest.mark.long
@pytest.mark.slow
def test_the_whole_census_reproduces_the_stored_categories(tmp_path, monkeypatch):
    """Every model type, sharded over 2 workers, from an empty cache (~150 s on 2 quiet cores): each gets exactly
    one category, none is untriaged, and under the transformers version the docs were made with, each category
    is the stored one (a newer transformers may change a model: then the docs are regenerated, not this test)."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    doc = json.loads(STORED.read_text())
    stored = {r["model_type"]: r["category"] for r in doc["results"]}
    results = run.census(model_types(), workers=2)
    got = {r.model_type: r.category for r in results}
    assert len(got) == len(results) == len(model_types()) and set(got.values()) <= set(CATEGORIES)
    assert not [t for t, c in got.items() if c == "untriaged"], [r.reason for r in results if r.category == "untriaged"]
    if doc.get("transformers") == transformers.__version__:
        assert got == stored, {t: (stored.get(t), c) for t, c in got.items() if stored.get(t) != c}
    assert classify_mod.MAX_EXAMPLES <= 3


def _adapter(model_type):
    mt = by_name()[model_type]
    return HFAdapter(shrink.build(mt.name, mt.class_name))


def test_a_hybrid_stack_is_checked_on_its_attention_layers():
    """Qwen3-Next: gated DeltaNet blocks with full attention every 4th; the adapter's blocks are the attention ones."""
    adapter = _adapter("qwen3_next")
    assert adapter.layer_ids == [3] and adapter.cfg.n_layers == 1
    _, cache = adapter.run_with_cache(torch.tensor([[3, 5, 7]]))
    assert cache["blocks.0.attn.hook_pattern"].shape[-2:] == (3, 3)
    result = classify(by_name()["qwen3_next"])
    assert result.category == "hybrid" and "GatedDeltaNet" in result.reason, result


def test_rotary_bases_keyed_by_layer_type():
    """rope_parameters keyed by layer type: one shared base is declared; differing bases declare none."""
    assert _adapter("olmo3").cfg.rotary_base == 500000.0  # both types 500000 (the adapter read 10000 before)
    cfg = _adapter("modernbert").cfg  # 160000 for full attention, 10000 for sliding
    assert cfg.rotary_base is None and cfg.rope_type == "per_layer_type"


def test_a_masked_lm_without_is_causal_flags_is_bidirectional():
    assert _adapter("deberta").cfg.attention_dir == "bidirectional"
    assert _adapter("llama").cfg.attention_dir == "causal"


@pytest.mark.parametrize("model_type, class_name", [
    ("nllb-moe", "NllbMoeForConditionalGeneration"),
    ("switch_transformers", "SwitchTransformersForConditionalGeneration"),
])
def test_the_shrink_keeps_expert_layers_in_a_shallow_stack(model_type, class_name):
    """A sparse step of 4 (NLLB-MoE) or Switch's derived step over 2 shrunk layers gave no expert layer at all:
    the census never met the router. Every shrunk layer routes through experts now."""
    from reports.census.shrink import build

    model = build(model_type, class_name)
    routers = [n for n, _ in model.named_modules() if n.endswith(".router")]
    assert len(routers) == 4, routers  # 2 encoder + 2 decoder layers
