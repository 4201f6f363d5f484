"""`attnlab probe` and `attnlab report` on encoder-decoders: the three stacks of heads shown apart.

attnlab's EncoderDecoder through `--model module:callable` and a tiny random BART through `--hf config.json`, probed
on `--task reverse`/`sort` (a padded source and its target). Every per-head file carries the `kind` column, and the
rendered report (HTML and Markdown) names encoder self-attention, decoder self-attention and cross-attention heads.
Bad combinations are one line and exit code 2 before any work.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from reports.cli import cli
from tests.helpers.cli_run import assert_one_line_error

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
PROBE_FAST = ["--sequences", "8", "--seeds", "0", "--top-k", "4", "--no-progress"]
# every method that writes a per-head file, and redundancy; the estimator comparison (it trains L0 gates) is slow
METHODS = "importance_gradient,importance_attribution,importance_ablation,importance_mean_ablation,redundancy," \
    "similarity,head_roles,attention_entropy,patterns"
FACTORY = '''
from tests.helpers.seq2seq_probe import encoder_decoder


def ed():
    return encoder_decoder()
'''
STACKS = ("encoder self-attention", "decoder self-attention", "cross-attention")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def factory(tmp_path_factory, one_thread):
    folder = tmp_path_factory.mktemp("factory")
    (folder / "edmodels.py").write_text(FACTORY)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)  # --model resolves from the current folder
        mp.syspath_prepend(str(ROOT))
        yield folder
        sys.modules.pop("edmodels", None)


@pytest.fixture(scope="module")
def probed(factory):
    """The per-head probe methods on the EncoderDecoder, then the report."""
    run = factory / "run"
    result = invoke("probe", "--model", "edmodels:ed", "--task", "reverse", "--out", str(run), "--methods", METHODS,
                    *PROBE_FAST)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    report = invoke("report", str(run))
    assert report.exit_code == 0, (report.stdout, report.stderr)
    return run, result


def test_probe_gives_every_per_head_file_the_three_stacks(probed):
    run, result = probed
    assert "through protocol model on (8, 7) tokens given a (8, 6) source" in result.stdout
    probes_dir = run / "probes"
    for name in ("importance_ablation", "importance_mean_ablation", "importance_gradient", "importance_attribution",
                 "head_roles", "attention_entropy"):
        frame = pd.read_csv(probes_dir / f"{name}.csv")
        assert frame["kind"].tolist() == ["encoder"] * 4 + ["decoder"] * 4 + ["cross"] * 4, name
    assert set(pd.read_csv(probes_dir / "patterns.csv")["kind"]) <= {"encoder", "decoder", "cross"}
    sim = pd.read_csv(probes_dir / "similarity_pattern.csv", index_col=0)
    assert {"enc L0H0", "L1H1", "xL1H1"} <= set(sim.index)
    redundancy = json.loads((probes_dir / "redundancy.json").read_text())
    assert redundancy["n_heads"] == 12 and "heads_needed_xL0" in redundancy
    source = pd.read_csv(probes_dir / "example_source_tokens.csv")
    assert list(source.columns) == ["position", "token", "real"] and len(source) == 6
    manifest = json.loads((probes_dir / "manifest.json").read_text())
    assert list(manifest["finished"]) == METHODS.split(",")


def test_the_report_names_each_stack(probed):
    run, _ = probed
    md, page = (run / "report.md").read_text(), (run / "report.html").read_text()
    for text in (md, page):
        assert all(stack in text for stack in STACKS)
        assert "Heads by stack" in text or "| stack | heads | most important head |" in text
        assert "heads cross-attention layer 1 needs (others intact)" in text
        assert "heads encoder self-attention layer 0 needs (others intact)" in text
        assert "Head roles n/a in cross-attention: previous_token, induction" in text
    stack_table = md[md.index("| stack | heads |"):].split("\n\n")[0]
    assert [line.split(" | ")[0].strip("| ") for line in stack_table.splitlines()[2:]] == list(STACKS)
    top = md[md.index("| most important heads (ablation) | stack |"):].split("\n\n")[0]
    assert any("| cross-attention |" in line for line in top.splitlines()[2:]) or \
        any("| encoder self-attention |" in line for line in top.splitlines()[2:])
    for figure in ("importance", "similarity", "head_roles", "attention_entropy", "patterns"):
        assert (run / "figures" / f"{figure}.png").stat().st_size > 1000


def test_resume_keeps_the_finished_methods_of_an_encoder_decoder_run(probed, factory):
    run, _ = probed
    again = invoke("probe", "--model", "edmodels:ed", "--task", "reverse", "--out", str(run), "--resume",
                   "--methods", METHODS, *PROBE_FAST[:-1], "--progress")
    assert again.exit_code == 0, (again.stdout, again.stderr)
    assert again.stderr.count("finished before, kept") == len(METHODS.split(","))


def test_heal_refuses_an_encoder_decoder_run(probed):
    run, _ = probed
    assert_one_line_error(invoke("heal", str(run)), 2, "holds the results of a model from outside attnlab")


@pytest.mark.parametrize(("args", "needle"), [
    (("--task", "induction"), "--task induction is a decoder-only task, and the model is an encoder-decoder"),
    (("--text", "words.txt"), "gives no source, and the model is an encoder-decoder: expected --task one of"),
])
def test_a_decoder_only_input_for_an_encoder_decoder_is_one_line(factory, args, needle):
    (factory / "words.txt").write_text("a b c")
    out = factory / "refused"
    assert_one_line_error(invoke("probe", "--model", "edmodels:ed", "--out", str(out), *args, *PROBE_FAST), 2, needle)


def test_hf_encoder_decoder_config_loads_its_seq2seq_head_and_probes_every_stack(tmp_path):
    from transformers import BartConfig

    BartConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
               decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32
               ).to_json_file(str(tmp_path / "config.json"))
    out = tmp_path / "bart"
    result = invoke("probe", "--hf", str(tmp_path / "config.json"), "--out", str(out), "--task", "sort",
                    "--methods", "importance_ablation,attention_entropy", *PROBE_FAST)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "HFSeq2SeqAdapter(bart, attention_interface)" in result.stdout
    assert json.loads((out / "model.json").read_text())["class"] == "BartForConditionalGeneration"
    frame = pd.read_csv(out / "probes" / "importance_ablation.csv")
    assert frame["kind"].tolist() == ["encoder"] * 2 + ["decoder"] * 2 + ["cross"] * 2
    assert frame["loss_delta"].notna().all()
    assert invoke("report", str(out)).exit_code == 0
    md = (out / "report.md").read_text()
    assert all(stack in md for stack in STACKS)


@pytest.mark.slow  # every method, the estimator comparison's L0 gate training included: a whole probe run
def test_every_method_runs_on_an_encoder_decoder(factory):
    run = factory / "all"
    result = invoke("probe", "--model", "edmodels:ed", "--task", "sort", "--out", str(run), *PROBE_FAST)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert len(json.loads((run / "probes" / "manifest.json").read_text())["finished"]) == 11
    estimators = pd.read_csv(run / "probes" / "estimators.csv")
    assert estimators.set_index("method").loc["ablation", "spearman"].eq(1.0).all()
    prune = pd.read_csv(run / "probes" / "prune_curve.csv")
    assert int(prune["n_pruned"].max()) == 12  # all three stacks' heads
    assert invoke("report", str(run)).exit_code == 0
    assert all(stack in (run / "report.md").read_text() for stack in STACKS)
