"""One census result per model type: build it tiny, wrap it, check it, and say in one category why.

The categories (:data:`CATEGORIES`) are a fixed list, and every path ends in one of them with the
exception text as the reason ("failed for an unknown reason" is not a category):

- ``clean``: every applicable row passes;
- ``finding``: a failed row that :data:`reports.census.findings.FINDINGS` documents with a witness on the raw model;
- ``untriaged``: a failed row without a witness: a false alarm of the adapter or a check, or a new bug
  (the census's goal is 0 of these);
- ``unobservable``: rows that need a hook the route never fires (the hooks named);
- ``no attention``: no attention module anywhere (Mamba, RWKV, xLSTM ...);
- ``hybrid``: attention in some layers, other mixers in the rest (the others named);
- ``multimodal wrapper``: the text model inside a multimodal model is what the rows check;
- ``transformers fails``: the raw tiny model raises on a plain text input, with the exception;
- ``unsupported``: the census cannot build the model, or the adapter cannot take it (what is missing).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch
from torch import nn

import properties as props
from harness.adapters import adapt
from harness.adapters import hf_routes as routes
from harness.adapters.protocol import observed_hooks
from reports.census import findings
from reports.census.enumerate import ModelType
from reports.census.shrink import build

CATEGORIES = ("clean", "finding", "untriaged", "unobservable", "no attention", "hybrid", "multimodal wrapper",
              "transformers fails", "unsupported")
MAX_EXAMPLES = 3  # per property: the census is wide, not deep (the zoo runs 10)
ENC_DEC = "encoder-decoder (HFSeq2SeqAdapter)"
PLAIN = torch.tensor([[3, 5, 7]])  # a plain text input: real tokens, no padding


@dataclass
class Result:
    """The census result of one model type (JSON-able: the cache and the docs read it back)."""

    model_type: str
    task: str = ""
    class_name: str = ""
    category: str = "unsupported"
    reason: str = ""
    stage: str = "config"  # the last stage reached: config, build, raw forward, adapter, check, done
    route: str = ""
    hooks: list[str] = field(default_factory=list)  # hook kinds that fire (blocks.0 names, less the prefix)
    rows: dict[str, str] = field(default_factory=dict)  # property -> status
    failures: dict[str, str] = field(default_factory=dict)  # property -> counterexample
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(**data)


def one_line(text: str, limit: int = 240) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


def exc_line(exc: BaseException) -> str:
    return one_line(f"{type(exc).__name__}: {exc}")


def plain_kwargs(mt: ModelType) -> dict[str, Any]:
    return {"decoder_input_ids": PLAIN[:, :2]} if mt.task == "seq2seq_lm" else {}


def mixers(model: Any) -> tuple[list[int], list[str]]:  # a PreTrainedModel (untyped module tree)
    """The layers of the block stack that hold an attention module, and the class names of the others' mixers."""
    config = model.config
    layers = routes.find_layers(model, getattr(config.get_text_config(), "num_hidden_layers", None))
    if layers is None:
        return [], []
    attn, others = [], []
    for i, layer in enumerate(layers):
        if routes.attention_module(layer) is not None:
            attn.append(i)
        else:
            others.append(_mixer_name(layer))
    return attn, sorted(set(others))


_MIXER_WORDS = ("Mixer", "Mamba", "Ssm", "SSM", "LinearAttn", "GatedDeltaNet", "Recurrent", "ShortConv", "Rwkv",
                "Lstm", "Fourier", "Retention")


def _mixer_name(layer: nn.Module) -> str:
    """The class of the sequence mixer that stands in for attention in ``layer`` (its own class when unnamed)."""
    names = [type(sub).__name__ for sub in layer.modules() if sub is not layer]
    for word in _MIXER_WORDS:
        hit = next((n for n in names if word in n and "Norm" not in n), None)
        if hit is not None:
            return hit
    return type(layer).__name__


def multimodal(model: Any) -> Optional[str]:
    """The text config's class where the model wraps a text model inside a multimodal one, else None."""
    config = model.config
    text = config.get_text_config()
    return type(text).__name__ if text is not config else None


def _hook_kinds(fired: set[str]) -> list[str]:
    kinds = {name.split(".", 2)[2] if name.startswith("blocks.") else name for name in fired}
    return sorted(kinds)


def classify(mt: ModelType, result: Optional[Result] = None,
             stages: Optional[Callable[[ModelType, Result], None]] = None) -> Result:
    """The census result of ``mt``; never raises for anything the model, its config or the adapter does.

    ``result`` is filled in place (a caller that interrupts it, e.g. on a timeout, still reads its stage);
    ``stages`` fills it (default: the raw census's; reports/census/bridge.py passes the bridge's).
    """
    start = time.perf_counter()
    result = result if result is not None else Result(mt.name, mt.task, mt.class_name)
    try:
        (stages or _classify)(mt, result)
    finally:
        result.seconds = round(time.perf_counter() - start, 2)
    return result


def _classify(mt: ModelType, r: Result) -> None:
    prepared = prepare(mt, r)
    if prepared is None:
        return
    model, seq2seq, hybrid = prepared
    r.stage = "adapter"
    try:
        adapter = adapt(model)  # HFAdapter, or HFSeq2SeqAdapter for an encoder-decoder
        r.route = adapter.route
    except Exception as exc:
        r.category, r.reason = "unsupported", f"{ENC_DEC if seq2seq else 'HFAdapter'}: {exc_line(exc)}"
        return
    check(adapter, r, ENC_DEC if seq2seq else "HFAdapter", multimodal(model), hybrid,
          {p: f.summary for p, f in findings.for_type(mt.name).items()})


def prepare(mt: ModelType, r: Result, config: Any = None) -> Optional[tuple[nn.Module, bool, Optional[str]]]:
    """Build ``mt`` tiny (from ``config`` when given), run it on a plain input and find its attention layers:
    ``(model, seq2seq, hybrid)``,
    where ``hybrid`` names the other mixers (None when every layer attends); None when a stage already gave
    ``r`` its category (unsupported, transformers fails, no attention). The bridge census shares these stages."""
    try:
        model = build(mt.name, mt.class_name, config)
    except Exception as exc:  # the shrunk config or the model cannot be built: its row says so, the census goes on
        r.category, r.reason = "unsupported", f"the census cannot build a tiny {mt.class_name}: {exc_line(exc)}"
        return None
    r.stage = "raw forward"
    try:
        with torch.no_grad():
            model(input_ids=PLAIN, **plain_kwargs(mt))
    except Exception as exc:
        r.category = "transformers fails"
        r.reason = f"{mt.class_name} on a plain input ({PLAIN.tolist()}): {exc_line(exc)}"
        return None
    seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))  # HFSeq2SeqAdapter (harness.adapters.adapt)
    attn, others = ([0], []) if seq2seq else mixers(model)
    if not attn:
        r.category = "no attention"
        r.reason = "no attention module in its blocks: " + (", ".join(others) or "no block stack found")
        return None
    hybrid = f"attention layers {attn} checked; {', '.join(others)} in the others" if others else None
    return model, seq2seq, hybrid


def check(adapter: Any, r: Result, label: str, text_config: Optional[str], hybrid: Optional[str],
          documented: Mapping[str, str], dtype: Optional[str] = None) -> None:
    """Run the property suite on ``adapter`` (a protocol model, named ``label`` in a reason) and give ``r`` its
    category; ``documented`` maps a property to the summary of its witnessed finding on this model type.
    ``dtype``: check_model's (None: the model's own, float32)."""
    try:
        r.hooks = _hook_kinds(observed_hooks(adapter))
    except Exception as exc:
        r.category, r.reason = "unsupported", f"{label}: {exc_line(exc)}"
        return
    r.stage = "check"
    try:
        frame = props.check_model(adapter, seed=0, max_examples=MAX_EXAMPLES, dtype=dtype)
    except Exception as exc:
        r.category, r.reason = "unsupported", f"check_model raised {exc_line(exc)}"
        return
    r.stage = "done"
    r.rows = {row.property: row.status for row in frame.itertuples()}
    r.failures = {row.property: one_line(str(row.counterexample)) for row in frame.itertuples()
                  if row.status == "fail"}
    reasons = {row.property: one_line(str(row.reason), 120) for row in frame.itertuples()
               if row.status == "unobservable"}
    verdict(r, reasons, text_config, hybrid, documented)


def verdict(r: Result, unobservable: dict[str, str], text_config: Optional[str], hybrid: Optional[str],
             documented: Mapping[str, str]) -> None:
    untriaged = sorted(p for p in r.failures if p not in documented)
    if untriaged:
        r.category = "untriaged"
        r.reason = "failed without a witness: " + "; ".join(f"{p}: {r.failures[p]}" for p in untriaged)
    elif r.failures:
        r.category = "finding"
        r.reason = "; ".join(f"{p}: {documented[p]}" for p in sorted(r.failures))
    elif hybrid is not None or text_config is not None:
        r.category = "hybrid" if hybrid is not None else "multimodal wrapper"
        r.reason = hybrid or f"the text model ({text_config}) checked through the wrapper's forward"
        if unobservable:
            r.reason += "; unobservable: " + ", ".join(sorted(unobservable))
    elif unobservable:
        r.category = "unobservable"
        r.reason = "; ".join(f"{p}: {why}" for p, why in sorted(unobservable.items()))
    else:
        r.category = "clean"
        r.reason = "every applicable row passes"
