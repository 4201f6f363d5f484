"""The pytest plugin (reports/pytest_plugin.py) as another project meets it: pytest run in a subprocess, in a folder
with no conftest, the plugin found through its ``pytest11`` entry point."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = re.compile(r"<!-- plugin-example:begin -->\n```python\n(.*?)```\n<!-- plugin-example:end -->", re.S)

MODELS = '''
import torch
import transformers


def test_a_small_llama(attnlab_check):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    attnlab_check(transformers.LlamaForCausalLM(config).eval())


class Leaky(torch.nn.Module):
    """A causal LM whose every position reads the mean of the whole sequence: the future and the padding."""

    def __init__(self):
        super().__init__()
        self.embed, self.unembed = torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64)

    def forward(self, tokens, attention_mask=None, position_offset=0):
        return self.unembed(self.embed(tokens).mean(1, keepdim=True).expand(-1, tokens.shape[1], -1))


def test_a_leaky_model(attnlab_check):
    attnlab_check(Leaky(), cfg=dict(n_layers=1, n_heads=1, d_head=16, d_model=16, d_vocab=64, n_ctx=32,
                                    positional_embedding_type="none", attention_dir="causal"))
'''


def readme_example() -> str:
    match = EXAMPLE.search((ROOT / "README.md").read_text())
    assert match, "README.md lost its plugin example (the plugin-example markers)"
    return match.group(1)


def run_pytest(folder: Path, *args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return subprocess.run([python, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def properties_of(junit: Path) -> dict[str, dict[str, str]]:
    """Each test case's recorded properties, by test name."""
    cases = ET.parse(junit).getroot().iter("testcase")
    return {case.get("name", ""): {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
            for case in cases}


def test_the_check_fixture_passes_a_correct_model_and_lists_every_failed_row(tmp_path):
    (tmp_path / "test_models.py").write_text(MODELS)
    done = run_pytest(tmp_path, "test_models.py", "--attnlab-max-examples", "3", "--junitxml", "junit.xml")
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "1 failed, 1 passed" in out, out
    # the message names each failed row with the figures that decided it and its shrunk counterexample
    assert re.search(r"- causal_outputs: worst [\d.e+-]+ > allowance .*counterexample: tokens=", out), out
    assert re.search(r"- padding_outputs: worst .*counterexample: tokens=.* mask=", out), out
    assert "reports/pytest_plugin.py" not in out and "properties/testing.py" not in out  # the test's frame only
    recorded = properties_of(tmp_path / "junit.xml")
    assert recorded["test_a_leaky_model"]["attnlab:causal_outputs"].startswith("fail")
    assert recorded["test_a_small_llama"]["attnlab:causal_outputs"].startswith("pass")
    assert not any(v.startswith("fail") for v in recorded["test_a_small_llama"].values())


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_a_bad_example_count_is_one_line(tmp_path, value):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    done = run_pytest(tmp_path, "--attnlab-max-examples", value)
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"argument --attnlab-max-examples: {value!r} is invalid: expected a positive integer" in done.stderr


def test_the_readme_example_is_the_one_tested():
    example = readme_example()
    assert "attnlab_check(" in example and "attnlab_kernel(" in example
    assert not re.search(r"^\s*(import|from)\s+(harness|properties|probes|reports)\b", example, re.M)


@pytest.mark.slow
def test_the_readme_example_in_a_fresh_project(tmp_path):
    """A new project with attnlab installed from a wheel of this tree (its dependencies are the test run's own,
    through a .pth, to spare downloading them again): the README's file gives two passes and the failure it
    promises, found through the installed entry point, not this checkout."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "wheel"), str(ROOT)], check=True, capture_output=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                          capture_output=True, text=True).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    wheel = next((tmp_path / "wheel").glob("attnlab-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True)
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_attention.py").write_text(readme_example())
    where = subprocess.run([python, "-c", "import reports.pytest_plugin as p; print(p.__file__)"], cwd=project,
                           check=True, capture_output=True, text=True).stdout
    assert where.startswith(site), where  # the installed copy, not this checkout
    done = run_pytest(project, "--attnlab-max-examples", "5", "--junitxml", "junit.xml", python=python)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "1 failed, 2 passed" in out, out
    failed = [name for name, rows in properties_of(project / "junit.xml").items()
              if any(v.startswith("fail") for v in rows.values())]
    assert failed == ["test_my_attention_is_a_correct_kernel"], failed
