"""The export stage: a run's model as a Hugging Face checkpoint (``save_pretrained``, safetensors).

``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads the result offline and computes
the run's logits (:func:`harness.model.convert.to_hf`: GPT-2 for absolute positions, to the bit,
attention-only models included; Llama for rotary; a design neither reproduces is refused, naming the
config field, before anything is written).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from transformers.utils import logging as hf_logging

import harness
from harness.errors import AttnlabError, AttnlabTypeError
from harness.model.convert import to_hf
from harness.training.checkpoint import prepare_run_dir
from reports import rundata


def export_hf(run_dir: str | os.PathLike, out_dir: str | os.PathLike, *, target: Optional[str] = None) -> Any:
    """Write the run's model into ``out_dir`` as ``save_pretrained`` output; returns the HF model."""
    path = rundata.require_run_dir(run_dir)
    if not isinstance(out_dir, (str, os.PathLike)):
        raise AttnlabTypeError(f"out_dir must be a path, got {type(out_dir).__name__}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise AttnlabError(f"export directory {out} is a file: expected a folder")
    hf = to_hf(harness.load_run(path), target=target)  # an unmappable config fails here, before any write
    prepare_run_dir(out)  # a read-only or full disk fails before the weights are written
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar for a write of a fraction of a second, printed even under --no-progress
    try:
        hf.save_pretrained(out, safe_serialization=True)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    return hf
