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

# (expected, observed) per witness kind, in words; the script prints both with the numbers
CLAIMS = {
    "left_padding_moves_positions": ("a masked left pad changes no real token's logits, cached or not",
                                     "they move: every real token is numbered one position on"),
    "padding_leaks_into_real_tokens": ("a masked pad's token id does not reach the real tokens",
                                       "changing it moves the real tokens' logits"),
    "window_ignored": ("no query attends to a key further back than config.sliding_window",
                       "the last of w + 2 queries puts weight on key 0"),
    "logits_depend_on_length": ("position 0's logits do not depend on the positions after it, so cached decoding "
                                "equals the full forward", "appending a token moves them, whatever its id"),
    "future_leaks_after_an_offset": ("with position_ids 1..4, positions 0..2 do not see token 3",
                                     "their logits move when token 3 changes"),
    "left_pad_shifts_compressed_windows": ("one masked left pad leaves the last logits unchanged",
                                           "they move, with the cache and without it"),
    "chunked_prefill_drops_state": ("cached decoding in chunks equals the full forward",
                                    "a chunk of three tokens after the prompt is off; one token at a time is exact"),
    "cached_chunk_differs": ("cached decoding of a chunk of two tokens equals the full forward",
                             "it is off; one token at a time is exact"),
    "longrope_cached_step_differs": ("cached decoding past original_max_position_embeddings equals the full "
                                     "forward", "it is off under longrope; exact under default rope"),
    "inv_freq_rounded_by_to": ("the float16 and bfloat16 rotations at position 127 are within a few u of a float64 "
                               "rotation", "after .to(dtype) one is 8 u and more off (inv_freq rounded to the dtype)"),
    "bridge_not_causal": ("the bridge, given attention_mask=[[1, 1]], is causal like the raw model",
                          "position 0's logits move when token 1 changes"),
    "bridge_attn_scores_is_pattern": ("hook_pattern = softmax(hook_attn_scores)",
                                      "hook_attn_scores is the post-softmax pattern itself"),
    "bridge_z_is_o_proj_input": ("hook_z = hook_pattern . hook_v", "hook_z is o_proj's input, after a later step"),
    "bridge_v_before_v_norm": ("hook_z = hook_pattern . hook_v", "hook_v is taken before v_norm"),
    "rotary_dim_ignored": ("rotary_dim (the channels RoPE turns) changes the logits",
                           "they are equal at rotary_dim = head_dim / 2 and = head_dim"),
    "softcap_ignored": ("attn_logit_softcapping caps the attention scores, so a cap of 0.01 changes the logits",
                        "they are exactly the uncapped model's")}


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
    (LongRoPE over the type's shrunk head size: most types' drawn configs never drew it; a soft cap)."""
    rows = json.loads((DOCS / "census_variants.json").read_text())["rows"]
    found = [r["minimal"] for r in rows if r["job"]["model_type"] == model_type and r["minimal"] is not None
             and finding.prop in (r["minimal_result"] or r["result"]).get("failures", {})]
    if found:
        return min(found, key=lambda m: (len(m), json.dumps(m, sort_keys=True)))
    if finding.witness == "longrope_cached_step_differs":
        return {"rope_parameters": longrope_parameters(model_type)}
    if finding.witness == "softcap_ignored":
        return {"attn_logit_softcapping": 0.01}  # the witness's own cap; the script builds with and without it
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

