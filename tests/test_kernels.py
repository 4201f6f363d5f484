"""The attention-kernel suite (properties/kernels/): every mutant caught by its row, the built-ins and the
unbroken reference clean, the reference formula against independent closed forms, results and CLI errors.

Fast tier: each kernel run is a few rows at float32 with the default examples (well under a second each);
the whole file runs in about 35 s on 2 cores. The built-ins at all three dtypes and the findings' witnesses
are `slow`.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import properties.testing
from harness.errors import AttnlabError
from properties.kernels import NAMES, Capabilities, Case, builtins, check_kernel
from properties.kernels.case import call
from properties.kernels.reference import allowance, eager, seen_rows
from reports.cli import cli
from tests.mutants.kernels import KERNEL_MUTANTS, RefKernel, WindowRight

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = ("eager", "eager_gemma2", "eager_gpt_oss", "sdpa", "sdpa_math", "sdpa_flash", "flex")


@pytest.mark.parametrize("mutant", KERNEL_MUTANTS, ids=lambda m: m.name)
def test_mutant_is_caught_by_its_row(mutant):
    frame = check_kernel(mutant.kernel, properties=[mutant.must_flag]).set_index("property")
    row = frame.loc[mutant.must_flag]
    assert row.status == "fail", f"{mutant.name} ({mutant.bug}) escaped {mutant.must_flag}: {row.to_dict()}"
    assert row.counterexample.startswith("b=") and "float32" in row.counterexample


@pytest.mark.parametrize("kernel", [RefKernel(), WindowRight("window_right")], ids=lambda k: k.attnlab_name)
def test_unbroken_reference_kernels_pass_every_row(kernel):
    # the kills above come from the planted bugs: the same kernel without them raises no alarm
    frame = check_kernel(kernel)
    assert list(frame.property) == list(NAMES)
    assert (frame.status == "pass").all(), frame[frame.status != "pass"].to_dict("records")
    assert (frame[frame.property != "determinism"].allowance > 0).all()


@pytest.mark.parametrize("name", ["eager", "sdpa", "eager_gpt_oss"])
def test_builtins_are_clean_at_float32(name):
    properties.testing.assert_kernel(builtins()[name], dtype="float32")


# a built-in's failed rows are findings, each with a witness that does not import attnlab (docs/findings/)
FINDINGS = {("flex_attention_uncompiled", "additive_bias"): "docs/findings/kernel_flex_attention_per_head_mask.py"}
# rows a built-in refuses on every input on this CPU (n/a, the refusal quoted); any other such row is the
# kernel not running at all, which must not pass as clean
REFUSALS = {("sdpa_flash", "value_dim"): "flash SDPA takes no value dim other than the key dim",
            ("flex_attention_uncompiled", "sinks"): "transformers: attention sinks cannot run on CPU with flex"}


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNNABLE, "flex_attention_uncompiled"])
def test_builtins_fail_only_their_findings_at_every_dtype(name):
    frame = check_kernel(builtins()[name], dtypes=("float32", "bfloat16", "float16"))
    failed = {(name, p) for p in frame[frame.status == "fail"].property}
    assert failed == {f for f in FINDINGS if f[0] == name}, frame[frame.status == "fail"].to_dict("records")
    refused = frame[frame.reason.str.startswith("raises on every input")]
    assert {(name, p) for p in refused.property} == {r for r in REFUSALS if r[0] == name}, refused.to_dict("records")


@pytest.mark.parametrize("name", ["flex", "flex_attention_uncompiled"])
def test_flex_untraced_gives_what_its_eager_trace_gives(name, monkeypatch):
    """The flex kernels run flex_attention's op without its torch.compile(backend="eager") trace
    (properties/kernels/builtins.py): the same outputs, to the bit, as through the trace."""
    kernels = importlib.import_module("properties.kernels.builtins")  # the package exports a function of that name
    cases = [Case(b=2, h=4, h_kv=2, q=5, k=7, causal=True, mask="bool", pad_left=(0, 2), window=3, seed=1),
             Case(b=1, q=3, k=6, mask="additive", bias="random", softcap=2.0, amplitude=4.0, seed=2),
             Case(b=2, q=4, k=4, causal=True, mask="additive", sinks=name == "flex", seed=3)]  # REFUSALS
    untraced = [call(builtins()[name], case) for case in cases]
    monkeypatch.setattr(kernels, "untraced", contextlib.nullcontext)
    traced = [call(builtins()[name], case) for case in cases]
    assert all(torch.equal(a, b) for a, b in zip(untraced, traced, strict=True))


@pytest.mark.slow
def test_finding_witnesses_reproduce():
    # each witness exits 1 while the bug it shows is present
    for path in FINDINGS.values():
        result = subprocess.run([sys.executable, path], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert result.returncode == 1, result.stdout + result.stderr


def test_reference_matches_closed_forms():
    # one key: the output is that key's value whatever the scores (softmax of one logit is 1); exact in float64
    case = Case(q=1, k=1, h=2, h_kv=1, softcap=3.0, bias="random", seed=3)
    t = case.tensors()
    out = eager(case, t, torch.float64)
    torch.testing.assert_close(out[0, 0], t["v"][0, 0, 0].double().expand(2, -1), rtol=0, atol=0)
    # a sink s with one key of score x: weight e^x / (e^x + e^s) (gpt-oss); float64, so 1e-12
    case = Case(q=1, k=1, h=1, h_kv=1, sinks=True, seed=4)
    t = case.tensors()
    x = float(t["q"][0, 0, 0].double() @ t["k"][0, 0, 0].double()) * case.scale
    w = math.exp(x) / (math.exp(x) + math.exp(float(t["sinks"][0])))
    torch.testing.assert_close(eager(case, t, torch.float64)[0, 0, 0], w * t["v"][0, 0, 0].double(),
                               rtol=1e-12, atol=1e-12)


def test_gqa_reference_repeats_each_kv_head_over_its_group():
    # query head i reads K/V head i // groups (transformers' repeat_kv): heads 0,1 -> 0 and 2,3 -> 1
    case = Case(h=4, h_kv=2, q=1, k=1, seed=5)
    t = case.tensors()
    out = eager(case, t, torch.float64)
    for head in range(4):
        torch.testing.assert_close(out[0, 0, head], t["v"][0, head // 2, 0].double(), rtol=0, atol=0)


def test_masks_follow_transformers_conventions():
    # bottom-right causal, window of w keys with the query's own, padding hides keys
    case = Case(q=2, k=5, causal=True, window=2, pad_left=(1,))
    assert case.visible()[0, 0].int().tolist() == [[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    additive = case.kernel_mask(case.tensors()) if case.mask != "none" else None
    assert additive is None
    t = Case(mask="additive", hidden=((0, 1),)).tensors()
    mask = Case(mask="additive", hidden=((0, 1),)).kernel_mask(t)
    assert mask is not None and mask[0, 0, 0, 1] == torch.finfo(torch.float32).min and mask[0, 0, 0, 0] == 0


def test_allowance_is_measured_and_never_zero():
    case = Case(q=1, k=1, h=1, h_kv=1, seed=0)  # one key: the plain formula is exact, the floor 0
    t = case.tensors()
    ref = eager(case, t, torch.float64)
    floor, allow = allowance(case, t, ref, seen_rows(case))
    assert floor == 0 and allow == 4 * 2.0 ** -24
    case = Case(q=8, k=8, dtype="bfloat16", seed=1)
    t = case.tensors()
    floor, allow = allowance(case, t, eager(case, t, torch.float64), seen_rows(case))
    assert allow == pytest.approx(4 * max(floor, 2.0 ** -9))


def test_layouts_keep_values_and_break_contiguity():
    for layout in ("transposed", "sliced"):
        case = Case(layout=layout, seed=2)
        x = case.tensors()["q"]
        y = case.laid_out(x)
        assert not y.is_contiguous() and torch.equal(y, x)


def test_declared_lack_is_na_and_raising_everywhere_is_na_with_the_error():
    class NoSinks(RefKernel):
        attnlab_capabilities = Capabilities(sinks="no sinks here")

    frame = check_kernel(NoSinks(), properties=["sinks"])
    assert frame.status.tolist() == ["n/a"] and frame.reason.tolist() == ["no sinks here"]

    def refuses(module, query, key, value, attention_mask, **kw):
        raise RuntimeError("backend refuses")

    frame = check_kernel(refuses, properties=["plain"])
    assert frame.status.tolist() == ["n/a"] and "backend refuses" in frame.reason.iloc[0]


def test_refusing_some_inputs_is_counted_and_the_rest_judged():
    def odd_dims_refused(module, query, key, value, attention_mask, **kw):
        if query.shape[-1] % 2:
            raise ValueError("odd head dim")
        return RefKernel()(module, query, key, value, attention_mask, **kw)

    frame = check_kernel(odd_dims_refused, properties=["plain"], max_examples=20)
    assert frame.status.tolist() == ["pass"] and "refused" in frame.reason.iloc[0]


def test_stand_in_module_reads_as_transformers_kernels_expect():
    case = Case(h=4, h_kv=2, causal=True, mask="bool", q=3, k=3)
    out = call(builtins()["sdpa"], case)
    assert out.shape == (1, 3, 4, 8) and torch.isfinite(out).all()


def test_assert_kernel_lists_failed_rows_with_counterexamples():
    mutant = next(m for m in KERNEL_MUTANTS if m.name == "sinks_dropped")
    with pytest.raises(AssertionError, match=r"sinks \(float32\).*counterexample: b="):
        properties.testing.assert_kernel(mutant.kernel, properties=["sinks", "plain"])


def test_check_kernel_rejects_bad_arguments_before_any_work():
    for bad in (dict(dtypes=("float8",)), dict(dtypes="float32"), dict(properties=["nope"]), dict(seed=-1),
                dict(max_examples=0)):
        with pytest.raises(AttnlabError):
            check_kernel(RefKernel(), **bad)
    with pytest.raises(AttnlabError):
        check_kernel(42)  # type: ignore[arg-type]


def user_kernel(module, query, key, value, attention_mask, **kw):
    return RefKernel()(module, query, key, value, attention_mask, **kw)


def not_a_kernel(x):
    return x


NOT_CALLABLE = 3


@pytest.mark.parametrize("spec, expected", [
    ("tests.no_such_module:f", "does not import"),
    ("tests.test_kernels:missing", "has no attribute"),
    ("tests.test_kernels:NOT_CALLABLE", "not callable"),
    ("tests.test_kernels:not_a_kernel", "expected a kernel fn(module, query, key, value, attention_mask"),
    ("no_colon", "expected module:function"),
])
def test_cli_bad_kernel_is_one_line_and_exit_2(spec, expected):
    result = CliRunner().invoke(cli, ["kernels", "--kernel", spec])
    assert result.exit_code == 2, result.output
    assert expected in result.output and len(result.output.strip().splitlines()) == 1


def test_cli_user_kernel_table():
    result = CliRunner().invoke(cli, ["kernels", "--kernel", "tests.test_kernels:user_kernel", "--max-examples", "3"])
    assert result.exit_code == 0, result.output
    assert "tests.test_kernels:user_kernel" in result.output and "sliding_window" in result.output
    assert "fail" not in result.output


def test_cli_unknown_builtin_and_write_docs_with_a_kernel_are_bad_input():
    result = CliRunner().invoke(cli, ["kernels", "--builtin", "nope"])
    assert result.exit_code == 2 and "expected one of" in result.output
    result = CliRunner().invoke(cli, ["kernels", "--builtin", "eager", "--write-docs"])
    assert result.exit_code == 2 and "--write-docs" in result.output


def test_kernels_doc_names_every_builtin_row_and_finding():
    # regenerated by `python -m reports.cli kernels --write-docs` (about 2 minutes on 2 cores)
    text = (ROOT / "docs" / "kernels.md").read_text()
    assert all(f"`{name}`" in text or f"| {name} |" in text for name in builtins())
    assert all(f"| {row} |" in text for row in NAMES)
    assert all(Path(path).name in text for path in FINDINGS.values())
