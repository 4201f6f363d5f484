"""The bridge census (`attnlab census --bridge`, reports/census/bridge.py and conformance.py).

Fast tier: the CLI flag, a supported architecture's row, the bridge's own categories (no architecture
adapter; the bridge raising on a plain input), a witnessed bridge finding, ``--only`` with ``--bridge``,
the cache key, and the docs section against docs/census_bridge.json (no model is built there).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
from click.testing import CliRunner

from harness.errors import AttnlabError
from reports.census import bridge as census_bridge
from reports.census import command, conformance, render, run
from reports.census.classify import Result
from reports.census.enumerate import by_name, model_types
from reports.census.findings import BRIDGE_FINDINGS, diagnosis
from reports.cli import cli
from tests.helpers.census_witness import WITNESSES

pytestmark = pytest.mark.usefixtures("one_thread")
STORED = Path(__file__).resolve().parents[1] / "docs" / conformance.RESULTS


def test_cli_flag_runs_the_bridge_census(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    out = tmp_path / "bridge.csv"
    result = CliRunner().invoke(cli, ["census", "--bridge", "--only", "bart", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "unsupported by the bridge" in result.output and "through the bridge" in result.output
    assert "raw finding → bridge unsupported by the bridge" in result.output  # the conformance line
    row = next(csv.DictReader(out.open()))
    assert (row["category"], row["raw_category"]) == ("unsupported by the bridge", "finding")
    assert any(p.name.startswith("bridge-transformer_lens-") for p in (tmp_path / "census").iterdir())
    assert "--bridge" in CliRunner().invoke(cli, ["census", "--help"]).output


def test_python_m_reports_census_takes_the_flag(tmp_path):
    done = subprocess.run([sys.executable, "-m", "reports.census", "--bridge", "--only", "bart"], capture_output=True,
                          text=True, env={**os.environ, "ATTNLAB_CACHE": str(tmp_path)}, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-4000:])
    assert "bart" in done.stdout and "unsupported by the bridge" in done.stdout, done.stdout


def test_a_supported_architecture_gives_a_checked_row():
    result = census_bridge.classify(by_name()["gpt2"])
    assert result.category == "clean" and result.route == "bridge", result
    assert result.rows["causal_pattern"] == "pass" and result.rows["kv_cache"] == "n/a"
    assert "attn.hook_pattern" in result.hooks and "hook_in" not in result.hooks  # protocol hook kinds only


def test_a_type_without_a_bridge_adapter_names_what_is_missing():
    result = census_bridge.classify(by_name()["bart"])  # the census builds BartForCausalLM
    assert result.category == "unsupported by the bridge", result
    assert "no architecture adapter for BartForCausalLM" in result.reason
    assert "BartForConditionalGeneration" in result.reason  # the head of bart the bridge does have


def test_the_bridge_raising_on_a_plain_input_is_its_own_category(monkeypatch):
    real = census_bridge.build_bridge

    def broken(model):
        bridge = real(model)

        def fail(*args, **kwargs):
            raise RuntimeError("the bridge broke")

        bridge.forward = fail
        return bridge

    monkeypatch.setattr(census_bridge, "build_bridge", broken)
    result = census_bridge.classify(by_name()["llama"])
    assert result.category == "bridge fails" and "RuntimeError: the bridge broke" in result.reason, result
    assert "the raw model runs it" in result.reason


def test_a_builder_error_is_unsupported_by_the_bridge(monkeypatch):
    def refuse(model):
        raise ValueError("no such component")

    monkeypatch.setattr(census_bridge, "build_bridge", refuse)
    result = census_bridge.classify(by_name()["llama"])
    assert result.category == "unsupported by the bridge" and "ValueError: no such component" in result.reason


def test_the_openai_bridge_finding_is_witnessed_and_never_hidden(monkeypatch):
    result = census_bridge.classify(by_name()["openai-gpt"])
    assert result.category == "finding", result
    assert {"causal_outputs", "causal_pattern"} <= set(result.failures)
    stored = json.loads((command.DOC.parent / render.RESULTS).read_text())
    raw = conformance.raw_snapshot([Result.from_json(r) for r in stored["results"]])["openai-gpt"]
    assert "causal_outputs" in conformance.raw_pass_bridge_fail(raw, result)  # the raw model passes it
    assert "raw model: 0" in WITNESSES["bridge_not_causal"]("openai-gpt")  # raises once fixed upstream
    monkeypatch.setattr(census_bridge, "documented", lambda model_type: {})  # no witness: untriaged, not hidden
    again = census_bridge.classify(by_name()["openai-gpt"])
    assert again.category == "untriaged" and "causal_outputs" in again.reason


@pytest.mark.parametrize("finding", BRIDGE_FINDINGS, ids=lambda f: f"{f.model_type}-{f.prop}")
def test_bridge_finding_reproduces_without_the_suite(finding):
    assert WITNESSES[finding.witness](finding.model_type)  # raises AssertionError once the bug is fixed


def test_only_with_bridge(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    lines: list[str] = []
    results = command.run(("gpt2", "mamba"), bridge=True, echo=lines.append)
    assert [r.model_type for r in results] == ["gpt2", "mamba"]
    assert results[1].category == "no attention" and "MambaForCausalLM" in results[1].reason
    assert any(line.startswith("2 model types through the bridge") for line in lines), lines
    with pytest.raises(AttnlabError, match="close matches: .*gpt2"):
        command.run(("gtp2",), bridge=True, echo=lines.append)
    with pytest.raises(AttnlabError, match="drop --only"):
        command.run(("gpt2",), bridge=True, write_docs=tmp_path / "models.md", echo=lines.append)


def test_the_bridge_cache_is_its_own():
    assert run.cache_key(bridge=True) == f"bridge-transformer_lens-{census_bridge.version()}-{run.cache_key()}"
    assert run.cache_dir(bridge=True) != run.cache_dir()


def test_differences_name_each_property_and_skip_the_adapters_kv_cache():
    raw = {"category": "clean", "rows": {"causal_pattern": "pass", "kv_cache": "pass", "sliding_window": "n/a"}}
    bridged = Result("x", rows={"causal_pattern": "fail", "kv_cache": "n/a", "sliding_window": "n/a"})
    assert conformance.differences(raw, bridged) == ["causal_pattern: pass → fail"]
    assert conformance.raw_pass_bridge_fail(raw, bridged) == ["causal_pattern"]
    assert conformance.differences({"category": "unsupported", "rows": {}}, bridged) == []


def test_write_docs_adds_the_bridge_section_after_the_raw_census(tmp_path):
    doc = tmp_path / "models.md"
    raw_section = f"{render.BEGIN}\nraw census\n{render.END}"
    doc.write_text(f"# Models\n\n{raw_section}\n\n## Later\n")
    results = [Result("gpt2", "causal_lm", "GPT2LMHeadModel", "clean", "every applicable row passes",
                      rows={"causal_pattern": "pass"})]
    raw = {"gpt2": {"category": "clean", "rows": {"causal_pattern": "pass"}}}
    versions = {"transformers": "x", "transformer_lens": "y"}
    for _ in range(2):  # the second write replaces the section
        conformance.write_docs(results, raw, doc, versions, "wall")
    text = doc.read_text()
    assert raw_section in text and text.count(conformance.BEGIN) == 1 and text.endswith("## Later\n")
    assert text.index(render.END) < text.index(conformance.BEGIN)
    assert conformance.load(doc) == (results, raw, versions, "wall")


def test_docs_are_the_stored_bridge_census():
    """docs/models.md's bridge section is rendered from docs/census_bridge.json (no model is built here)."""
    results, raw, versions, wall = conformance.load(command.DOC)
    text = command.DOC.read_text()
    assert conformance.section(results, raw, versions, wall) in text, \
        "docs/models.md's bridge section is stale: run attnlab census --bridge --write-docs"
    assert conformance.summary_line(results) in text
    assert {r.model_type for r in results} == {m.name for m in model_types()} or \
        versions["transformers"] != transformers.__version__
    assert all(r.category in census_bridge.CATEGORIES for r in results)
    for r in results:  # a failed row is a finding only with a witness; a diagnosed false alarm stays untriaged
        witnessed = all(p in census_bridge.documented(r.model_type) for p in r.failures)
        assert not r.failures or r.category == ("finding" if witnessed else "untriaged"), r
        if any(diagnosis(r.model_type, p) for p in r.failures):
            assert r.model_type in text.split("### Untriaged bridge rows", 1)[1], r.model_type
