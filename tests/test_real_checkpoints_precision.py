"""Real trained checkpoints at the precisions they ship and run in: no false alarm, and real bugs still caught.

The two checkpoints of tests/helpers/checkpoints.py (SmolLM2-135M-Instruct, a 30-layer Llama; Gemma-3-270m,
18 layers with sliding windows of 512) are checked in bfloat16 and float16 as a user loads them
(``from_pretrained(dtype=...)``, through :func:`reports.external.load_hf`). Every row's allowance is its
measured rounding noise against a float64 twin (properties/precision.py), so a correct checkpoint has no
failed row at any precision. The one exception is a finding: Gemma-3 in float16 overflows (its residual
passes float16's 65504 at layer 7; the raw-model witness is in tests/test_real_checkpoints.py), which
``finite_outputs`` names and every other row reports as "not comparable" rather than failed.

Catalogue bugs (tests/field_bugs/catalogue.py: real bugs from public trackers, as patches of the library
code they lived in) patched into the real checkpoints in bfloat16: all five are caught (a row the catalogue
names fails; see REAL_BUGS); unpatched, same kernel, the rows pass with no note.

Slow tier: each case loads a real model (a few seconds from the converted cache) and runs 18-30 layers
per pass; two examples per property (fewer examples, not fewer dtypes).
"""

from __future__ import annotations

import pytest

from harness.adapters import adapt
from properties import check_model
from properties.precision import HIDDEN, NOT_COMPARABLE
from reports.external import load_hf
from tests.field_bugs.catalogue import BUGS
from tests.helpers.checkpoints import converted

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
MAX_EXAMPLES = 2
SMOLLM2, GEMMA3 = "smollm2-135m-instruct", "gemma-3-270m"
# the rows a correct checkpoint must be checked on, not n/a or unobservable (float16 Gemma-3: see below)
CHECKED = {"causal_outputs", "causal_pattern", "pattern_distribution", "padding_outputs", "batch_independence",
           "attention_scale", "relative_position", "rotary_norm", "kv_cache", "finite_outputs"}
# catalogue bug -> (checkpoint, attention kernel it lived in (None: the checkpoint's default), verdict in bfloat16)
# "caught": a row the catalogue names fails. "hidden": none fails, one is noted hidden under rounding (its
# float64 twin fails it). xformers103 on SmolLM2 was "hidden" (floor 0.25 of the logits' scale, allowance 1.0,
# the bug 0.54); with the float64 twin made once, after the determinism probe on the model itself, its
# causal_outputs floor is 0.019 (allowance 0.076) and the bug (0.94 of the scale: position 0's logits move by
# 1.18 when token 1 changes) fails the row at ratio 12.
# Examples per row where two are too few for the verdict to be the bug's rather than the CPU's: xformers103's
# first draw is the minimal tokens=[[0, 0]] -> [[0, 1]], where the unmasked bug lets position 0 attend to a
# second <|endoftext|>, and on a CPU with AVX512-BF16 the buggy model's causal_outputs floor is 0.25 of the
# logits' scale there (allowance 1.0, the bug 0.54: hidden; the previous CI machine caught it at two examples).
# At five, kernel_consistency fails at ratio 19 (hook_z from the unmasked kernel against the causal pattern:
# 1.50, allowance 0.077), while causal_outputs stays hidden (floors 0.11-0.50 on the buggy model's draws).
EXAMPLES = {"xformers103_causal_skipped_without_mask": 5}
REAL_BUGS = {
    "labml146_softmax_over_queries": (SMOLLM2, "eager", "caught"),
    "pytorch63271_padding_masks_query_rows": (SMOLLM2, "eager", "caught"),
    "hf25681_llama_inv_freq_bf16": (SMOLLM2, None, "caught"),
    "hf29623_window_one_wider": (GEMMA3, "eager", "caught"),
    "xformers103_causal_skipped_without_mask": (SMOLLM2, "sdpa", "caught"),
}


def _checked(name: str, dtype: str, kernel=None, properties=None, max_examples: int = MAX_EXAMPLES):
    model, _, _ = load_hf(str(converted(name)), dtype=dtype, attn_implementation=kernel)
    return check_model(adapt(model), max_examples=max_examples, properties=properties).set_index("property")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_smollm2_has_no_false_alarm_in_low_precision(dtype):
    frame = _checked(SMOLLM2, dtype)
    failed = frame[frame.status == "fail"]
    assert failed.empty, failed[["worst", "allowance", "counterexample"]].to_string()
    assert CHECKED <= set(frame.index[frame.status == "pass"])
    measured = frame.loc[sorted(CHECKED - {"causal_pattern", "finite_outputs"})]
    assert measured.noise_floor.gt(0).all()  # each numeric verdict was calibrated, not skipped


@pytest.mark.long
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemma3_has_no_false_alarm(dtype):
    frame = _checked(GEMMA3, dtype)
    failed = frame[frame.status == "fail"]
    assert failed.empty, failed[["worst", "allowance", "counterexample"]].to_string()
    assert CHECKED | {"sliding_window"} <= set(frame.index[frame.status == "pass"])


@pytest.mark.long
def test_gemma3_in_float16_fails_finite_outputs_and_nothing_else():
    """finite_outputs names the finding the raw-model witness proves (tests/test_real_checkpoints.py): it runs each
    input with <bos> as its first real token, as every served prompt has it, and names the first layer."""
    frame = _checked(GEMMA3, "float16")
    assert frame.loc["finite_outputs", "status"] == "fail"
    where = frame.loc["finite_outputs", "counterexample"]
    assert "layer 7, blocks.7.hook_resid_post" in where and "<bos>=2" in where, where
    others = frame.drop(index="finite_outputs")
    assert others.status.ne("fail").all(), others[others.status == "fail"].counterexample.to_dict()
    # a row that met the overflow says so instead of an inf deviation
    met = others[others.reason.str.startswith(NOT_COMPARABLE)]
    assert met.status.eq("unobservable").all() and met.worst.isna().all()


@pytest.mark.long
@pytest.mark.parametrize("bug_name", REAL_BUGS)
def test_catalogue_bug_patched_into_a_real_checkpoint_in_bfloat16(bug_name):
    bug = next(b for b in BUGS if b.name == bug_name)
    name, kernel, verdict = REAL_BUGS[bug_name]
    props, n = list(bug.must_flag), EXAMPLES.get(bug_name, MAX_EXAMPLES)
    clean = _checked(name, "bfloat16", kernel, props, n)
    assert clean.status.eq("pass").all(), clean[["status", "worst", "allowance", "counterexample"]].to_dict("index")
    assert not clean.reason.str.startswith(HIDDEN).any()  # a correct checkpoint's twin passes too
    with bug.patch():
        broken = _checked(name, "bfloat16", kernel, props, n)
    failed, hidden = broken.status.eq("fail"), broken.reason.str.startswith(HIDDEN)
    seen = "caught" if failed.any() else "hidden" if hidden.any() else "missed"
    assert seen == verdict, broken[["status", "worst", "allowance", "reason"]].to_dict("index")
