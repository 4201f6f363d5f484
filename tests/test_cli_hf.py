"""`attnlab check/probe --hf PATH` and `--model module:callable`: other people's models into a run directory.

Tiny Hugging Face models are built from configs in memory and written with save_pretrained into
tmp_path (no network); a folder holding only config.json gives random weights. Every bad input is
one line on stderr, exit code 2, before any work (nothing written).
"""

from __future__ import annotations

import json
import textwrap

import pandas as pd
import pytest
from click.testing import CliRunner

from reports.cli import cli
from tests.helpers.cli_run import assert_one_line_error
from tests.helpers.hf_models import VOCAB, gpt2, llama

FAST = ["--max-examples", "2", "--no-progress"]
PROBE_FAST = ["--sequences", "4", "--seeds", "0", "--top-k", "1", "--no-progress"]
WORDS = [f"w{i}" for i in range(VOCAB - 1)]


def card_path(run_dir) -> str:
    return json.loads((run_dir / "model.json").read_text())["path"]


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def save_tokenizer(folder) -> None:
    """A word-level tokenizer over WORDS (ids < VOCAB), saved the way save_pretrained does."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *WORDS])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(str(folder))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    llama().save_pretrained(str(root / "llama"))
    save_tokenizer(root / "llama")
    (root / "gpt2_config").mkdir()
    gpt2().config.to_json_file(str(root / "gpt2_config" / "config.json"))
    return root


@pytest.fixture(scope="module")
def checked(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "llama"
    result = invoke("check", "--hf", str(models / "llama"), "--out", str(out), *FAST)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return out, result


def test_check_hf_folder_writes_properties_and_card(checked):
    out, result = checked
    assert "through HFAdapter(llama, attention_interface)" in result.stdout
    table = pd.read_csv(out / "properties.csv")
    assert {"causal_outputs", "rotary_norm", "kv_cache"} <= set(table["property"])
    assert "fail" not in set(table["status"]), table[["property", "status", "reason"]]
    card = json.loads((out / "model.json").read_text())
    assert card["adapter"] == "HFAdapter(llama, attention_interface)"
    assert (card["arch"], card["route"], card["class"], card["weights"]) == \
        ("llama", "attention_interface", "LlamaForCausalLM", "pretrained")
    assert card["design"]["n_key_value_heads"] == 2 and card["design"]["positional_embedding_type"] == "rotary"


def test_report_renders_an_external_run(checked):
    out, _ = checked
    result = invoke("report", str(out))
    assert result.exit_code == 0, (result.stdout, result.stderr)
    md = (out / "report.md").read_text()
    assert "HFAdapter(llama, attention_interface)" in md and "LlamaForCausalLM" in md
    assert "train field" not in md  # no training config: the model card stands in for it
    assert "The head probes have not run yet" in md  # a missing stage is marked, not an error
    assert f"attnlab probe --hf {card_path(out)} --out {out.resolve()}" in md  # with the command that fills it in
    assert "<table" in (out / "report.html").read_text()


def test_probe_config_only_with_task_then_report(models, tmp_path):
    out = tmp_path / "gpt2"
    result = invoke("probe", "--hf", str(models / "gpt2_config"), "--out", str(out), "--task", "induction",
                    "--seed", "3", *PROBE_FAST)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "through HFAdapter(gpt2, attention_interface) on (4, 32) tokens" in result.stdout
    card = json.loads((out / "model.json").read_text())
    assert card["weights"] == "random (seed 3)" and card["class"] == "GPT2LMHeadModel"
    imp = pd.read_csv(out / "probes" / "importance_ablation.csv")
    assert len(imp) == 2 * 4  # gpt2(): 2 layers x 4 heads
    result = invoke("report", str(out))
    assert result.exit_code == 0, (result.stdout, result.stderr)
    md = (out / "report.md").read_text()
    assert f"The property suite has not run yet: `attnlab check --hf {card_path(out)} --out" in md


@pytest.mark.parametrize(("is_decoder", "expected"), [(False, "BertForMaskedLM"), (True, "BertLMHeadModel")])
def test_encoder_config_gets_its_masked_lm_head(tmp_path, is_decoder, expected):
    from transformers import BertConfig

    from reports import external

    BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
               max_position_embeddings=32, is_decoder=is_decoder).to_json_file(str(tmp_path / "config.json"))
    ext = external.open_model(hf=str(tmp_path / "config.json"))
    assert ext.card["class"] == expected and ext.card["adapter"] == "HFAdapter(bert, attention_interface)"
    assert ext.model.cfg.attention_dir == ("causal" if is_decoder else "bidirectional")


def test_text_is_tokenized_by_the_saved_tokenizer(models, tmp_path):
    from reports import external

    text = tmp_path / "words.txt"
    text.write_text(" ".join(WORDS[i % 20] for i in range(200)))
    ext = external.open_model(hf=str(models / "llama"))
    tokens, loss_mask = external.text_tokens(ext, text, sequences=8, seq_len=128)
    assert loss_mask is None and tuple(tokens.shape) == (3, 64)  # 200 tokens cut at n_ctx=64
    assert tokens[0, :3].tolist() == [1, 2, 3] and tokens[1, 0].item() == 64 % 20 + 1  # "w0 w1 w2" -> 1, 2, 3
    assert tuple(external.text_tokens(ext, text, sequences=2, seq_len=16)[0].shape) == (2, 16)


@pytest.mark.slow
def test_probe_text_end_to_end(models, tmp_path):
    text = tmp_path / "words.txt"
    text.write_text(" ".join(WORDS[i % 20] for i in range(200)))
    out = tmp_path / "text"
    result = invoke("probe", "--hf", str(models / "llama"), "--out", str(out), "--text", str(text), *PROBE_FAST)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    tokens = pd.read_csv(out / "probes" / "example_tokens.csv")["token"].tolist()
    assert tokens[:3] == [1, 2, 3]  # "w0 w1 w2" -> ids 1, 2, 3 ([UNK] is 0)
    assert "on (3, 64) tokens" in result.stdout  # 200 tokens cut at n_ctx=64


FACTORY = textwrap.dedent('''
    import torch
    from torch import nn

    from tests.helpers.hf_models import llama


    class CumulativeMean(nn.Module):
        """Causal by construction: position t sees the mean embedding of tokens 0..t."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Embedding(64, 16)
            self.out = nn.Linear(16, 64)

        def forward(self, tokens, attention_mask=None, position_offset=0):
            x = self.embed(tokens)
            if attention_mask is not None:
                x = x * attention_mask[..., None]
            count = torch.arange(1, tokens.shape[1] + 1, device=tokens.device)[None, :, None]
            return self.out(x.cumsum(1) / count)


    CFG = dict(n_layers=1, n_heads=1, d_head=16, d_model=16, d_vocab=64, n_ctx=32,
               positional_embedding_type="none", attention_dir="causal")


    def pair():
        return CumulativeMean(), CFG


    def hf():
        return llama()


    def broken():
        model = llama()
        def forward(*args, **kwargs):
            raise RuntimeError("my kernel is broken")
        model.model.forward = forward
        return model


    def broken_pair():
        def forward(tokens, attention_mask=None, position_offset=0):
            raise RuntimeError("shape mismatch in my attention")
        return forward, CFG


    def not_a_model():
        return 42


    def raises():
        raise KeyError("no such checkpoint")


    value = 3
''')


@pytest.fixture
def factory(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)  # --model resolves from the current folder
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    return tmp_path


def test_model_factory_pair_runs_output_properties(factory):
    result = invoke("check", "--model", "mymodels:pair", "--out", "run", *FAST)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "unobservable: " in result.stdout.splitlines()[-1] and "causal_pattern" in result.stdout.splitlines()[-1]
    table = pd.read_csv(factory / "run" / "properties.csv").set_index("property")
    assert table.loc["causal_outputs", "status"] == "pass"
    assert table.loc["causal_pattern", "status"] == "unobservable"  # no hook points on a plain module
    assert json.loads((factory / "run" / "model.json").read_text())["adapter"] == "FunctionModel"


def test_model_factory_hf_model_is_wrapped(factory):
    from reports import external

    ext = external.open_model(factory="mymodels:hf")
    assert (ext.card["source"], ext.card["factory"], ext.card["adapter"]) == \
        ("model", "mymodels:hf", "HFAdapter(llama, attention_interface)")
    tokens, loss_mask = external.task_tokens(ext.model, "copy", 4, seed=0)
    assert tokens.shape[0] == 4 and int(tokens.max()) < VOCAB and loss_mask.shape == tokens.shape


# --- bad input: one line, exit 2, nothing written ------------------------------------------------
@pytest.mark.parametrize(("spec", "needle"), [
    ("mymodels", "not of the form module:callable"),
    ("nosuchmodule:build", "cannot be imported"),
    ("mymodels:nosuch", "has no attribute 'nosuch'"),
    ("mymodels:value", "not a callable factory"),
    ("mymodels:not_a_model", "returned a int: expected a protocol model"),
    ("mymodels:raises", "raised KeyError"),
    ("mymodels:broken", "raised RuntimeError on a plain 2-token input: my kernel is broken"),
    ("mymodels:broken_pair", "(FunctionModel) raised RuntimeError on a plain 2-token input: shape mismatch"),
])
def test_bad_model_factory(factory, spec, needle):
    assert_one_line_error(invoke("check", "--model", spec, "--out", "run", *FAST), 2, needle)
    assert not (factory / "run").exists()


def test_bad_hf_paths(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "config.json").write_text("{not json")
    (tmp_path / "notype").mkdir()
    (tmp_path / "notype" / "config.json").write_text('{"hidden_size": 4}')
    cases = [(tmp_path / "missing", "does not exist"), (tmp_path / "empty", "holds no config.json"),
             (tmp_path / "corrupt", "is not valid JSON"), (tmp_path / "notype", "has no model_type")]
    for path, needle in cases:
        assert_one_line_error(invoke("check", "--hf", str(path), "--out", str(tmp_path / "run"), *FAST), 2, needle)
    assert not (tmp_path / "run").exists()


def test_unsupported_architecture_names_it_and_lists_supported(tmp_path):
    from transformers import MambaConfig

    (tmp_path / "mamba").mkdir()
    MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, state_size=4).to_json_file(
        str(tmp_path / "mamba" / "config.json"))
    err = assert_one_line_error(invoke("check", "--hf", str(tmp_path / "mamba"), "--out", str(tmp_path / "run")), 2,
                                "architecture 'mamba'", "supported architectures: ")
    assert "llama" in err and "gpt2" in err


def test_run_directory_rules(models, tmp_path):
    hf = str(models / "gpt2_config")
    trained = tmp_path / "trained"
    (trained / "checkpoint").mkdir(parents=True)
    assert_one_line_error(invoke("check", "--hf", hf, "--model", "m:f", "--out", "x"), 2, "both given")
    assert_one_line_error(invoke("check", "--hf", hf, "--out", str(trained)), 2, "holds a trained run")
    assert_one_line_error(invoke("check", str(trained), "--hf", hf), 2, "holds a trained run")
    assert_one_line_error(invoke("check", "--hf", hf), 2, "needs --out RUN_DIR")
    assert_one_line_error(invoke("check", str(trained), "--out", "x"), 2, "--out x is for --hf/--model")
    assert_one_line_error(invoke("check", "a", "--hf", hf, "--out", "b"), 2, "differ")
    assert_one_line_error(invoke("check"), 2, "missing RUN_DIR")
    assert_one_line_error(invoke("probe", "--hf", hf, "--out", "x"), 2, "exactly one of --task NAME and --text")
    assert_one_line_error(invoke("probe", str(trained), "--task", "copy"), 2, "--task/--text are for --hf/--model")
    assert not (tmp_path / "x").exists()


def test_text_without_tokenizer(models, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("w1 w2 w3")
    out = tmp_path / "run"
    assert_one_line_error(invoke("probe", "--hf", str(models / "gpt2_config"), "--out", str(out), "--text", str(text)),
                          2, "needs the model's tokenizer", "holds no tokenizer")
    assert not out.exists()
