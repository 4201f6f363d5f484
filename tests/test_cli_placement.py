"""`attnlab check|probe --dtype/--device/--attn-implementation`: the user's precision and placement.

`--dtype auto` (the default) is the checkpoint's own dtype; `--hf` loads the weights in the asked
dtype (from_pretrained(dtype=...)), and model.json records what ran. A dtype, device or kernel the
machine cannot run is one line and exit code 2 before the model is loaded (the loader is replaced
by one that fails the test).
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from harness.adapters import placement
from reports import external
from reports.cli import cli
from tests.helpers.cli_run import assert_one_line_error, copy_run
from tests.helpers.hf_models import llama

FAST = ["--max-examples", "2", "--no-progress"]


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    llama().save_pretrained(str(root / "f32"))
    llama().to(torch.bfloat16).save_pretrained(str(root / "bf16"))  # config.json says dtype bfloat16
    return root


def card(out) -> dict:
    return json.loads((out / "model.json").read_text())


def test_auto_is_the_checkpoints_own_dtype_and_the_card_says_what_ran(folders, tmp_path):
    out = tmp_path / "auto"
    result = invoke("check", "--hf", str(folders / "bf16"), "--out", str(out), *FAST)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "in bfloat16 on cpu (sdpa)" in result.stdout
    seen = card(out)
    assert (seen["dtype"], seen["dtype_requested"], seen["device"], seen["attn_implementation"]) == \
        ("bfloat16", "auto", "cpu", "sdpa")


def test_the_weights_are_loaded_in_the_asked_dtype_not_cast_after(folders, tmp_path, monkeypatch):
    loaded = []
    real = external.load_hf

    def spy(*args, **kwargs):
        model, source, tokenizer = real(*args, **kwargs)
        loaded.append((kwargs, {p.dtype for p in model.parameters()}))
        return model, source, tokenizer

    monkeypatch.setattr(external, "load_hf", spy)
    out = tmp_path / "bf16"
    result = invoke("probe", "--hf", str(folders / "f32"), "--out", str(out), "--task", "copy", "--dtype", "bfloat16",
                    "--sequences", "2", "--seeds", "0", "--top-k", "1", "--attn-implementation", "eager",
                    "--no-progress")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert loaded == [({"dtype": "bfloat16", "device": None, "attn_implementation": "eager"}, {torch.bfloat16})]
    seen = card(out)
    assert (seen["dtype"], seen["dtype_requested"], seen["attn_implementation"]) == ("bfloat16", "bfloat16", "eager")


@pytest.mark.parametrize(("args", "needles"), [
    (["--dtype", "half"], ["'--dtype'", "'half'"]),
    (["--device", "nowhere"], ["device='nowhere' is not a torch device"]),
    (["--device", "cuda:7"], ["device='cuda:7' is not available on this machine"]),
    (["--attn-implementation", "no_such_kernel"], ["attn_implementation='no_such_kernel'", "'sdpa'"]),
])
@pytest.mark.parametrize("command", ["check", "probe"])
def test_a_placement_the_machine_cannot_run_is_refused_before_the_model_is_loaded(folders, tmp_path, monkeypatch,
                                                                                  command, args, needles):
    if "cuda:7" in args and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    monkeypatch.setattr(external, "load_hf", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "run"
    task = ["--task", "copy"] if command == "probe" else []
    assert_one_line_error(invoke(command, "--hf", str(folders / "f32"), "--out", str(out), *task, *args), 2, *needles)
    assert not out.exists()


def test_a_dtype_the_device_lacks_is_one_line_before_the_load(folders, tmp_path, monkeypatch):
    # A CPU build without float16 kernels fails the probe matmul; check_placement's probe is what refuses it.
    monkeypatch.setattr(placement, "_runs", lambda dtype, device: "\"addmm_impl_cpu_\" not implemented for 'Half'"
                        if dtype == torch.float16 else None)
    monkeypatch.setattr(external, "load_hf", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "run"
    assert_one_line_error(invoke("check", "--hf", str(folders / "f32"), "--out", str(out), "--dtype", "float16"), 2,
                          "dtype='float16' cannot run on device 'cpu'", "addmm_impl_cpu_")
    assert not out.exists()


def test_a_trained_run_is_checked_at_the_asked_dtype_and_refuses_a_kernel(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run")
    result = invoke("check", str(run), "--dtype", "float64", *FAST)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert_one_line_error(invoke("check", str(run), "--attn-implementation", "eager", *FAST), 2,
                          "attn_implementation='eager' cannot be chosen for Transformer")
