"""Which standalone reproductions there are: one per (witness, model type) of the live findings, and their configs.

The census's tiny config of the type (shrink.tiny_config) is what a script embeds literally; a variant finding's
changes are its smallest minimal failing config in docs/census_variants.json (reports/census/repro.py writes them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import transformers

from harness.errors import AttnlabError
from reports.census import shrink, variants
from reports.census.enumerate import by_name
from reports.census.findings import BRIDGE_FINDINGS, FINDINGS, VARIANT_FINDINGS, Finding

DOCS = Path(__file__).resolve().parents[2] / "docs"


@dataclass(frozen=True)
class Repro:
    """One script: a witness run on one model type, standing for every finding of that type it witnesses."""

    model_type: str
    witness: str
    findings: tuple[Finding, ...]
    source: str  # "census", "variants" or "bridge": which census recorded the findings
    changes: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)  # a variant's drawn changes

    @property
    def props(self) -> tuple[str, ...]:
        return tuple(f.prop for f in self.findings)

    @property
    def filename(self) -> str:
        return f"{self.model_type.replace('-', '_')}__{self.witness}.py"


def _group(findings: tuple[Finding, ...], source: str) -> list[Repro]:
    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.model_type, f.witness), []).append(f)
    return [Repro(t, w, tuple(fs), source, variant_changes(t, fs[0]) if source == "variants" else {})
            for (t, w), fs in groups.items()]


def live() -> list[Repro]:
    """Every live finding's script, sorted by file name (findings.py already drops those the installed release
    fixed)."""
    out = [*_group(FINDINGS, "census"), *_group(VARIANT_FINDINGS, "variants"), *_group(BRIDGE_FINDINGS, "bridge")]
    return sorted(out, key=lambda r: r.filename)


def for_type(model_type: str) -> list[Repro]:
    """The scripts of ``model_type``; an unknown type, or one without a live finding, is an AttnlabError (checked
    before any config is built)."""
    with_findings = sorted({f.model_type for f in (*FINDINGS, *VARIANT_FINDINGS, *BRIDGE_FINDINGS)})
    if model_type not in with_findings:
        what = (f"has no live finding under transformers {transformers.__version__}" if model_type in by_name()
                else f"is not a model type transformers {transformers.__version__} maps for causal, masked or "
                "seq2seq LM")
        raise AttnlabError(f"--repro {model_type!r} {what}: expected a model type with a live finding, one of "
                           f"{', '.join(with_findings)}")
    return [r for r in live() if r.model_type == model_type]


def variant_changes(model_type: str, finding: Finding) -> dict[str, Any]:
    """The smallest minimal failing config docs/census_variants.json holds for this finding, else the witness's own
    (LongRoPE over the type's shrunk head size: most types' drawn configs never drew it)."""
    rows = json.loads((DOCS / "census_variants.json").read_text())["rows"]
    found = [r["minimal"] for r in rows if r["job"]["model_type"] == model_type and r["minimal"] is not None
             and finding.prop in (r["minimal_result"] or r["result"]).get("failures", {})]
    if found:
        return min(found, key=lambda m: (len(m), json.dumps(m, sort_keys=True)))
    if finding.witness == "longrope_cached_step_differs":
        return {"rope_parameters": longrope_parameters(model_type)}
    raise AttnlabError(f"{model_type}: no minimal failing config of {finding.prop} in docs/census_variants.json")


def longrope_parameters(model_type: str, original: int = 4) -> dict[str, Any]:
    """LongRoPE as Phi-3 ships it (a factor per rotated pair), with a short original context, over the type's shrunk
    head size and partial rotary (as tests/helpers/census_variant_witness.py::longrope draws it)."""
    base = variants.base_dict(model_type, by_name()[model_type].class_name)
    partial = base["rope_parameters"].get("partial_rotary_factor", 1.0)
    head_dim = base.get("head_dim") or base["hidden_size"] // base["num_attention_heads"]
    half = int(head_dim * partial) // 2
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 32.0,
            "original_max_position_embeddings": original, "short_factor": [1.0] * half, "long_factor": [2.0] * half}
    return {**rope, "partial_rotary_factor": partial} if "partial_rotary_factor" in base["rope_parameters"] else rope


def config_values(repro: Repro) -> dict[str, Any]:
    """The constructor arguments of the census's tiny config of the type (shrink.tiny_config, literally), with a
    variant's changes applied (variants.build_config) except LongRoPE's, which the script passes to build()."""
    class_name = by_name()[repro.model_type].class_name
    config_class = getattr(transformers, class_name).config_class
    default = config_class()
    values = shrink.changes(default.to_dict(), repro.model_type)
    if class_name.endswith(("ForCausalLM", "LMHeadModel")) and getattr(default, "is_decoder", None) is False:
        values["is_decoder"] = True  # the causal-LM head's declaration (shrink.tiny_config)
    if repro.witness != "longrope_cached_step_differs":
        values.update(repro.changes)
    return values

