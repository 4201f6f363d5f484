"""Configuration variants (reports/census/variants*.py): the strategy, the run, the shrink, the CLI, the docs.

Fast tier: the strategy only draws fields the config class has and every rope type the installed transformers
ships, a seeded draw is reproducible, a config transformers refuses is its own category, the greedy reset
finds the fields a failure needs, the docs are the stored rows, and a seeded sample (2 drawn configs of a
handful of types, one worker, an empty cache) gets the stored categories with none untriaged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import AttnlabError
from reports.census import command, executor, variants, variants_command, variants_render, variants_run
from reports.census.classify import Result
from reports.census.enumerate import by_name
from reports.census.findings import variant_diagnosis
from reports.cli import cli

pytestmark = pytest.mark.usefixtures("one_thread")
STORED = Path(__file__).resolve().parents[1] / "docs" / variants_render.RESULTS
SAMPLE = ("llama", "gemma2", "bloom", "gpt2", "t5")


def _base(model_type):
    mt = by_name()[model_type]
    return variants.base_dict(mt.name, mt.class_name)


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "falcon", "t5", "gpt_neox"])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_drawn_changes_name_only_fields_the_config_class_has(model_type, data):
    d = _base(model_type)
    changes = data.draw(variants.overrides(d))
    assert set(changes) <= set(d)
    heads = changes.get("num_attention_heads") or changes.get("n_head") or changes.get("num_heads")
    kv = changes.get("num_key_value_heads")
    if heads and kv:
        assert heads % kv == 0  # grouped, multi-query or one per head: never a count the heads cannot share


def test_every_rope_type_is_drawn_and_accepted_by_its_config():
    d = _base("llama")
    seen = set()

    @settings(max_examples=300, deadline=None, database=None)
    @given(variants.overrides(d))
    def draws(changes):
        rope = changes.get("rope_parameters")
        if rope:
            seen.add(rope["rope_type"])
            config = variants.build_config("llama", "LlamaForCausalLM", changes)
            assert config.rope_parameters["rope_type"] == rope["rope_type"]

    draws()
    assert seen == set(variants.ROPE_TYPES) >= {"default", "linear", "dynamic", "yarn", "longrope", "llama3"}


def test_a_seeded_draw_is_reproducible_and_starts_at_the_shrunk_default():
    first = variants.draw("gemma2", "Gemma2ForCausalLM", 6, seed=3)
    assert first == variants.draw("gemma2", "Gemma2ForCausalLM", 6, seed=3)
    assert len(first) == 6 and len({json.dumps(c, sort_keys=True) for c in first}) == 6 and first[0] == {}
    assert first != variants.draw("gemma2", "Gemma2ForCausalLM", 6, seed=4)


def test_a_config_transformers_refuses_is_its_own_category():
    executor.init_worker()
    job = variants_run.Job("llama", "causal_lm", "LlamaForCausalLM", 0, "float32", {"hidden_act": "no-such-act"})
    result = variants_run.attempt(job, job.changes, timeout_s=60)
    assert result.category == variants_run.REFUSED, result
    assert "no-such-act" in result.reason


def test_the_greedy_reset_keeps_exactly_the_fields_the_failure_needs(monkeypatch):
    """A fake attempt that fails while both ``a`` and ``c`` are set: the reset drops ``b`` and ``d`` only."""
    def fake(job, changes, timeout_s):
        r = Result(job.model_type, job.task, job.class_name, stage="done")
        if "a" in changes and "c" in changes:
            r.category, r.failures = "untriaged", {"kv_cache": "drawn"}
        else:
            r.category = "clean"
        return r

    monkeypatch.setattr(variants_run, "attempt", fake)
    job = variants_run.Job("llama", "causal_lm", "LlamaForCausalLM", 1, "float32", {"a": 1, "b": 2, "c": 3, "d": 4})
    row = variants_run.Row.from_json(variants_run.run_job(job))
    assert row.minimal == {"a": 1, "c": 3} and row.result["category"] == "untriaged"
    assert row.shrink_notes == ["reset b", "reset d"]


def test_bad_input_is_one_line_and_exit_2():
    for args in (["--variants", "0"], ["--variants", "two"], ["--variants", "2", "--only", "lama"],
                 ["--seed", "3"]):
        result = CliRunner().invoke(cli, ["census", *args])
        assert result.exit_code == 2, (args, result.output)
    with pytest.raises(AttnlabError, match="--variants 0 is invalid"):
        variants_command.run(0, ("llama",))
    with pytest.raises(AttnlabError, match="close matches: .*llama"):
        variants_command.run(2, ("lama",))


def test_the_default_types_are_the_stated_lists():
    names = [m.name for m in variants_command.default_types()]
    assert len([n for n in names if n in variants_command.DECODERS]) == 40
    assert {n for n in names if n in variants_command.ENCODER_DECODERS} == set(variants_command.ENCODER_DECODERS)


def test_docs_are_the_stored_variants():
    """docs/models.md's variants section is rendered from docs/census_variants.json (no model is built here)."""
    stored = json.loads(STORED.read_text())
    rows = [variants_run.Row.from_json(r) for r in stored["rows"]]
    if stored["transformers"] == transformers.__version__:  # the findings rendered beside it follow the installed
        section = variants_render.section(rows, stored["transformers"], stored)
        assert section in command.DOC.read_text(), "docs/models.md is stale: rerun --variants"
    configs = {(r.job["model_type"], r.job["index"]) for r in rows}
    assert len(configs) >= 1000 and len({t for t, _ in configs}) == len(variants_command.default_types())
    # an untriaged row is a false alarm whose cause in attnlab is diagnosed (findings.VARIANT_DIAGNOSES), or none
    unknown = [(r.job["model_type"], sorted(r.result["failures"])) for r in rows if r.category == "untriaged"
               and not all(variant_diagnosis(r.job["model_type"], p) for p in r.result["failures"])]
    assert not unknown or stored["transformers"] != transformers.__version__, unknown


def test_the_stored_verdicts_follow_todays_findings():
    """Each stored row's category is what findings.py gives its failures today (variants_run.retriage): a finding
    added or removed after the run means python -m reports.census.variants_command, not a stale JSON."""
    stored = json.loads(STORED.read_text())
    if stored["transformers"] != transformers.__version__:
        pytest.skip(f"stored under transformers {stored['transformers']}; findings follow the installed "
                    f"{transformers.__version__} (a fixed bug's finding is gone): rerun the variants census")
    rows = [variants_run.Row.from_json(r) for r in stored["rows"]]
    stale = [(r.job["model_type"], r.job["index"], r.job["dtype"]) for r in rows
             if variants_run.retriage(r).to_json() != r.to_json()]
    assert not stale, stale


def test_a_seeded_sample_gets_the_stored_categories(tmp_path, monkeypatch):
    """2 drawn configs of a handful of types at float32, one worker, an empty cache: none untriaged, and under the
    stored transformers version each check's category is the stored one (same seed, same draws)."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    stored = json.loads(STORED.read_text())
    types = [by_name()[t] for t in SAMPLE]
    rows = variants_run.run_jobs(variants_command.jobs(types, 2, stored["seed"], ("float32",)), workers=1)
    assert len(rows) == 2 * len(SAMPLE) and {r.category for r in rows} <= set(variants_run.CATEGORIES)
    assert not [r.result["reason"] for r in rows if r.category == "untriaged"
                and not all(variant_diagnosis(r.job["model_type"], p) for p in r.result["failures"])]
    if stored["transformers"] == transformers.__version__:
        before = {(r["job"]["model_type"], json.dumps(r["job"]["changes"], sort_keys=True), r["job"]["dtype"]):
                  r["result"]["category"] for r in stored["rows"]}
        got = {(r.job["model_type"], json.dumps(r.job["changes"], sort_keys=True), r.job["dtype"]): r.category
               for r in rows}
        assert {k: v for k, v in got.items() if before.get(k, v) != v} == {}
        assert set(got) <= set(before)  # the stored run drew these configs too
