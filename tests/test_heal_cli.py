"""`attnlab heal` and `attnlab export` end to end: healed runs, heal.csv, the report section, a Hugging
Face checkpoint that transformers loads offline with the same logits; bad input is one line, exit 2."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

from harness import ModelConfig, TrainConfig, load_run, train
from harness.model.head_mask import head_mask_of
from harness.training.checkpoint import read_configs
from reports.cli import cli
from reports.heal import COLUMNS

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = ModelConfig(n_layers=2, d_model=32, n_heads=2, d_vocab=16, n_ctx=16)
CFG = TrainConfig(seq_len=16, batch_size=8, steps=15, warmup=2, eval_every=15, log_every=5, eval_batches=1,
                  checkpoint_every=None, device="cpu")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("heal") / "run"
    train(MODEL, CFG, path, progress=False)
    return path


def invoke(args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_heal_writes_runs_the_report_shows(run, tmp_path):
    out = tmp_path / "healed"
    result = invoke(["heal", run, "--prune-fraction", "0.25,0.5", "--steps", "3", "--seeds", "0", "--out", out,
                     "--temperature", "3", "--alpha", "0.7", "--no-progress"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(run / "probes" / "heal.csv")
    assert tuple(table.columns) == COLUMNS
    assert set(table["stage"]) == {"before", "fine-tuned", "distilled"}
    assert len(table) == 2 * 2 * 3 and table[["loss", "accuracy"]].notna().all().all()
    distilled = sorted(p for p in out.iterdir() if p.name.endswith("distilled"))
    assert len(distilled) == 4
    student = load_run(distilled[0])
    assert head_mask_of(student) is not None and sum(map(sum, head_mask_of(student))) < 4
    _, cfg = read_configs(distilled[0])
    assert (cfg.temperature, cfg.alpha, cfg.distill_from) == (3.0, 0.7, str(run))
    report = invoke(["report", run])
    assert report.exit_code == 0, report.output
    html = (run / "report.html").read_text()
    assert 'id="heal"' in html and "Prune, then heal" in html
    assert "## Prune, then heal" in (run / "report.md").read_text()


@pytest.mark.parametrize(("args", "needles"), [
    (["--prune-fraction", "1.0"], ["prune_fraction=1.0", "(0, 1)"]),
    (["--prune-fraction", "0"], ["prune_fraction=0.0"]),
    (["--prune-fraction", "0.9"], ["prune_fraction=0.9", "prunes all 4 heads"]),
    # 0.875 * 4 = 3.5 rounds (half to even) to 4: the bound itself is refused, and the message says so
    (["--prune-fraction", "0.875"], ["prune_fraction=0.875", "expected less than 0.875"]),
    (["--temperature", "0"], ["temperature=0.0"]),
    (["--alpha", "1.5"], ["alpha=1.5"]),
    (["--steps", "0"], ["--steps"]),
])
def test_heal_bad_input_is_one_line_before_any_work(run, tmp_path, args, needles):
    one_line_error(invoke(["heal", run, *args, "--out", tmp_path / "healed"]), *needles)
    assert not (tmp_path / "healed").exists()


def test_heal_of_a_missing_run_is_one_line(tmp_path):
    one_line_error(invoke(["heal", tmp_path / "nothing"]), "nothing")


def test_export_loads_with_auto_model_offline_and_gives_the_same_logits(run, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = invoke(["export", run, "--out", tmp_path / "hf"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hf" / "model.safetensors").exists()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    tokens = torch.randint(0, MODEL.d_vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        err = (hf(tokens).logits - load_run(run)(tokens)).abs().max().item()
    print(f"export: max |AutoModelForCausalLM(OUT_DIR) - ours| = {err}")
    assert err == 0.0  # the same kernels on both sides: tests/test_export.py


def test_export_of_an_attention_only_run_is_exact(tmp_path):
    path = tmp_path / "attn-only"
    train(MODEL.replace(attn_only=True), CFG.replace(steps=2), path, progress=False)
    assert invoke(["export", path, "--out", tmp_path / "hf"]).exit_code == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(0, MODEL.d_vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(hf(tokens).logits, load_run(path)(tokens))


def test_export_of_an_unmappable_design_names_the_field(tmp_path):
    path = tmp_path / "alibi"
    train(MODEL.replace(positional_embedding_type="alibi"), CFG.replace(steps=1), path, progress=False)
    one_line_error(invoke(["export", path, "--out", tmp_path / "hf"]), "positional_embedding_type='alibi'")
    assert not (tmp_path / "hf").exists()


def test_export_has_no_hf_option(run, tmp_path):
    """--hf names an input model everywhere (check, probe); export's folder is --out. No silent alias."""
    result = invoke(["export", run, "--hf", tmp_path / "hf"])
    assert result.exit_code == 2 and "No such option '--hf'" in result.output, result.output
    assert not (tmp_path / "hf").exists()
