"""The property registry (properties/registry.py): one module per property, and lists that cannot drift.

The suite's rows, ``properties.__all__``, ``properties.checks.__all__``, docs/properties.md, the mutant
catalogue and the kill matrix all come from (or are checked against) the registry; adding a
property is one module plus its mutant, shown with a temporary property registered here.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import textwrap
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import properties
import properties.checks
from properties import doc, registry
from properties.registry import Applies, Plan, model_property
from tests.mutants import kill_matrix
from tests.mutants.base import RefConfig, RefModel
from tests.mutants.catalogue import MUTANTS

DOC = Path(__file__).resolve().parents[1] / "docs" / "properties.md"
API = ["check_model", "check_protocol", "observed_hooks", "required_hooks", "PROPERTIES", "PropertyResult",
       "STATUSES", "FunctionModel", "BridgeAdapter", "AdapterConfig", "saturation_sweep", "loglog_slope"]

pytestmark = pytest.mark.usefixtures("one_thread")


def public_check_modules() -> list[str]:
    return [f"properties.checks.{m.name}" for m in pkgutil.iter_modules(properties.checks.__path__)
            if not m.name.startswith("_")]


def doc_table_names(text: str) -> list[str]:
    return re.findall(r"^\| `(\w+)` \|", text, flags=re.M)


def test_every_check_module_registers_exactly_one_property():
    per_module = Counter(p.module for p in registry.registered())
    assert sorted(per_module) == sorted(public_check_modules())
    assert set(per_module.values()) == {1}, per_module
    # a module is named for its idea, never after its property: properties.checks.<name> is only the check
    short = {m.rsplit(".", 1)[1] for m in per_module}
    assert not short & set(registry.names())


def test_suite_exports_docs_catalogue_and_kill_matrix_read_one_list():
    model_props = [p.name for p in registry.registered("model")]
    components = [p.name for p in registry.registered("component")]
    assert components == ["rotary_formula", "sinusoidal_formula"]
    assert list(properties.PROPERTIES) == model_props and len(model_props) == 23  # 19 + 4 encoder-decoder
    assert registry.names() == model_props + components
    assert properties.__all__ == API + registry.names()
    assert properties.checks.__all__ == registry.names()
    for name in registry.names():
        assert getattr(properties, name) is getattr(properties.checks, name) is registry.REGISTRY[name].check
    assert doc_table_names(DOC.read_text()) == registry.names()
    # every suite property is killed by some mutant's must_flag, and the catalogue names no other
    assert {p for m in MUTANTS for p in m.must_flag} == set(model_props)


def test_kill_matrix_columns_are_the_suite(monkeypatch):
    monkeypatch.setattr(kill_matrix, "MUTANTS", [])
    assert list(kill_matrix.kill_matrix().columns) == list(properties.PROPERTIES)


def test_docs_properties_md_is_generated_from_the_registry():
    assert DOC.read_text() == doc.render(), f"docs/properties.md is stale: run {doc.COMMAND}"


def test_applicability_is_the_registry_s():
    cfg = SimpleNamespace(positional_embedding_type="rotary", attention_dir="bidirectional", n_ctx=2, d_vocab=8)
    applies = Applies(attention=("causal",), min_ctx=2, reason="attention_dir={cfg.attention_dir!r}")
    assert applies.not_applicable(SimpleNamespace(cfg=cfg)) == "attention_dir='bidirectional'"
    assert Applies(positional=("rotary",), min_ctx=2).not_applicable(SimpleNamespace(cfg=cfg)) is None
    assert Applies(positional=("rotary",), min_ctx=3).not_applicable(SimpleNamespace(cfg=cfg)) == ""
    assert applies.text() == "causal; n_ctx >= 2" and Applies().text() == "every model"
    with pytest.raises(ValueError, match="positional=\\('learned',\\)"):
        Applies(positional=("learned",))


def test_alternative_hooks_take_the_first_that_fires():
    model = SimpleNamespace(hook_dict={"blocks.0.attn.hook_attn_scores": 0, "blocks.0.attn.hook_pattern": 0})
    wanted = ["blocks.0.attn.hook_attn_scores|blocks.0.attn.hook_pattern"]
    assert registry._resolve(model, wanted, lambda: {"blocks.0.attn.hook_pattern"}) == (
        ("blocks.0.attn.hook_pattern",), "")
    assert registry._resolve(model, wanted, lambda: set()) == ((), "needs hook_attn_scores or hook_pattern: hook "
                                                                   "blocks.0.attn.hook_pattern exists but never "
                                                                   "fires on this model")


def test_registering_twice_or_without_a_docstring_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    taken = registry.REGISTRY["kv_cache"]
    with pytest.raises(ValueError, match="'kv_cache' .* clashes with 'kv_cache'"):
        registry.register(taken)
    with pytest.raises(ValueError, match="order 120.* clashes with 'kv_cache'"):
        model_property(name="new_one", order=taken.order, tolerance=0.0, rule="exact")(properties.kv_cache)
    with pytest.raises(ValueError, match="has no docstring"):
        model_property(name="new_two", order=10_001, tolerance=0.0, rule="exact")(lambda case: None)
    with pytest.raises(ValueError, match="needs_doc"):
        model_property(name="new_three", order=10_002, tolerance=0.0, rule="exact", needs=lambda cfg: ())


# --- adding a property is one module (and its mutant) ---------------------------------------------

NEW_PROPERTY = '''
"""A temporary property for tests/test_properties_registry.py: the same input gives the same logits."""

from harness.adapters.protocol import forward_capture
from properties.checks._common import LOGIT_RTOL, LOGIT_RULE, fmt, max_len, scaled_deviation
from properties.registry import Applies, Case, Plan, model_property
from properties.strategies import token_batches


@model_property(name="repeatable_logits", order=10_000, tolerance=LOGIT_RTOL, rule=LOGIT_RULE,
                applies=Applies(attention=("causal",)), needs=("blocks.{layer}.attn.hook_pattern",))
def repeatable_logits(case: Case) -> Plan:
    """Two forward passes over the same tokens give the same logits."""
    model = case.model

    def measure(x):
        a, _ = forward_capture(model, x)
        b, _ = forward_capture(model, x)
        dev, idx = scaled_deviation(b, a)
        return dev, f"logits differ by {fmt(dev)} at (row, pos, vocab)={idx}"

    return Plan(token_batches(case.cfg.d_vocab, max_len=max_len(case.cfg)), measure)
'''


class NoisyModel(RefModel):
    """The temporary property's mutant: a little noise on every forward pass."""

    def forward(self, tokens, attention_mask=None, position_offset=0, cache=None):
        out = super().forward(tokens, attention_mask, position_offset, cache)
        return out + 0.1 * torch.randn_like(out)


@pytest.fixture
def new_property(tmp_path, monkeypatch):
    """The module above, registered, then unregistered; ``properties`` is reloaded both times for ``__all__``."""
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    (tmp_path / "repeatable_logits_check.py").write_text(textwrap.dedent(NEW_PROPERTY))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("repeatable_logits_check")
    importlib.reload(properties)
    yield module
    monkeypatch.undo()  # the registry and sys.path as they were
    sys.modules.pop("repeatable_logits_check", None)
    importlib.reload(properties)


def test_a_new_property_module_is_a_row_an_export_and_a_docs_row(new_property):
    name = "repeatable_logits"
    assert list(properties.PROPERTIES)[-1] == name
    assert name in properties.__all__ and name in registry.names()
    assert properties.repeatable_logits is properties.checks.repeatable_logits is new_property.repeatable_logits
    assert doc_table_names(doc.render())[-3:] == [name, "rotary_formula", "sinusoidal_formula"]
    assert "| `repeatable_logits` | model | Two forward passes over the same tokens give the same logits. | causal |" \
        in doc.render()
    # the registry did the set-up: n/a, unobservable and the search itself
    ref = RefModel(RefConfig())
    assert properties.check_model(ref, max_examples=3, properties=[name]).status[0] == "pass"
    bidirectional = RefModel(RefConfig(attention_dir="bidirectional"))
    assert properties.repeatable_logits(bidirectional).status == "n/a"
    noisy = properties.check_model(NoisyModel(RefConfig()), max_examples=3, properties=[name]).iloc[0]
    assert noisy.status == "fail" and noisy.counterexample  # its mutant is caught


def test_the_temporary_property_is_gone_afterwards():
    # runs after the test above in file order (-p no:randomly); holds in any order anyway
    assert "repeatable_logits" not in properties.PROPERTIES and "repeatable_logits" not in properties.__all__
    with pytest.raises(AttributeError, match="no property 'repeatable_logits'"):
        properties.repeatable_logits  # noqa: B018
    assert doc_table_names(doc.render()) == registry.names()


def test_plan_defaults_describe_tokens():
    plan = Plan(strategy=None, measure=lambda x: (0.0, ""))  # type: ignore[arg-type]
    assert plan.describe(torch.tensor([[1, 2]])) == "tokens=[[1, 2]]" and plan.info() == ""
