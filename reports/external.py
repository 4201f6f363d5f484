"""Other people's models for ``attnlab check`` and ``attnlab probe``: ``--hf PATH`` and ``--model module:callable``.

``--hf PATH`` is a local ``save_pretrained`` folder (weights loaded with ``local_files_only=True``)
or a ``config.json`` (a folder holding only one, or the file itself) for a randomly initialised
model seeded by ``--seed``; ``--model module:callable`` imports a user's factory (resolved from
the current folder) that returns a protocol model, a ``PreTrainedModel``, a ``TransformerBridge``
or ``(nn.Module or function, cfg)``. Either way the model goes behind its adapter
(:func:`harness.adapters.adapt`) and is smoke-tested on a plain two-token input *before* any work,
so a model that cannot run is one error naming the exception.

The run directory gets ``model.json`` (:func:`model_card`): where the model came from, its
architecture, adapter and route, and the design facts the checks read; ``attnlab report`` shows it
as the model card of a run that has no training. Every failure a user can cause is a ValueError,
TypeError or FileNotFoundError naming the value and what was expected (the CLI prints one line).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from transformer_lens import HookedRootModule
from transformers import (
    AttentionInterface,
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES
from transformers.utils import logging as hf_logging

from harness.adapters.entry import adapt, describe, needs_adapter
from harness.adapters.function import FunctionModel
from harness.adapters.placement import check_placement, placed, placement_of
from harness.adapters.protocol import check_protocol, is_encoder_decoder
from harness.errors import AttnlabError, AttnlabTypeError
from harness.run_dir import RunDir, atomic_write_json
from harness.training.seq2seq_task import FIRST_SYMBOL, Seq2SeqTask
from harness.training.tasks import TASKS, make_task

TEXT_SEQ_LEN = 128  # tokens per --text sequence (capped by the model's n_ctx)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


@dataclass
class ExternalModel:
    """A model from outside attnlab, behind the protocol, with what the run directory records of it."""

    model: Any  # the protocol model (an adapter, or the user's own protocol model)
    card: dict[str, Any]
    tokenizer_path: Optional[Path] = None  # the --hf folder when it holds a tokenizer


# --- --hf PATH -----------------------------------------------------------------------------------
def _config_file(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"--hf {path} does not exist: expected a save_pretrained folder or a config.json")
    config = path if path.is_file() else path / "config.json"
    if path.is_file() and path.suffix != ".json":
        raise AttnlabError(f"--hf {path} is a file but not a .json config: expected a save_pretrained folder or a "
                           f"config.json")
    if not config.is_file():
        raise AttnlabError(f"--hf {path} is not a model folder: it holds no config.json (expected a save_pretrained "
                           f"folder or a config.json)")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AttnlabError(f"{config} is not valid JSON ({exc}): expected a Hugging Face model config") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise AttnlabError(f"{config} has no model_type: expected a Hugging Face model config (save_pretrained "
                           f"writes one)")
    return config


def _auto_classes(config: Any) -> tuple[Any, ...]:
    """The Auto classes to try, in order: an encoder-decoder (``is_encoder_decoder``) its sequence-to-sequence LM
    head, whose forward runs encoder, decoder and cross-attention (BART's causal LM head is its decoder alone);
    else the head the config names (``architectures``, written by save_pretrained), else a causal LM head, except
    that a model type with both heads (BERT-style encoders, whose causal head is a decoder variant) gets its
    masked LM head unless ``is_decoder``."""
    if getattr(config, "is_encoder_decoder", False):
        return (AutoModelForSeq2SeqLM,)
    names = getattr(config, "architectures", None) or []
    if any(str(n).endswith("ForMaskedLM") for n in names):
        return AutoModelForMaskedLM, AutoModelForCausalLM
    encoder = config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False)
    if not names and encoder:
        return AutoModelForMaskedLM, AutoModelForCausalLM
    return AutoModelForCausalLM, AutoModelForMaskedLM


def check_kernel(name: Optional[str]) -> None:
    """``--attn-implementation NAME`` is a kernel transformers knows (checked before any model is loaded)."""
    if name is None:
        return
    known = ["eager", *AttentionInterface._global_mapping]
    if name not in known:
        raise AttnlabError(f"attn_implementation={name!r} is not an attention kernel transformers knows: expected "
                           f"one of {known}")


def load_hf(path: str | os.PathLike, seed: int = 0, *, dtype: Optional[str] = None, device: Any = None,
            attn_implementation: Optional[str] = None) -> tuple[Any, dict[str, Any], Optional[Path]]:
    """``(PreTrainedModel, source facts, tokenizer folder or None)`` for ``--hf PATH`` (see the module docstring).

    The model is loaded in ``dtype`` (``from_pretrained(dtype=...)``; "auto"/None: the config's own
    ``torch_dtype``), not cast after the load, with ``attn_implementation`` when given, and moved to
    ``device``: every one of them checked before the weights are read.
    """
    hf_logging.disable_progress_bar()  # transformers' loading bars are noise around a one-line command
    torch_dtype, dev = check_placement(dtype, device)
    check_kernel(attn_implementation)
    path = Path(path)
    config_file = _config_file(path)
    folder = config_file.parent
    weights = path.is_dir() and any((folder / name).exists() for name in WEIGHT_FILES)
    try:
        config = AutoConfig.from_pretrained(str(folder if path.is_dir() else config_file), local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise AttnlabError(f"{config_file} is not a config transformers can read: {' '.join(str(exc).split())[:300]}") \
            from None
    # "auto" is the checkpoint's own dtype; a config.json without one (random weights) is float32, torch's default
    own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    load: dict[str, Any] = {"dtype": torch_dtype or ("auto" if weights else own or torch.float32)}
    if attn_implementation is not None:
        load["attn_implementation"] = attn_implementation
    errors = []
    for auto in _auto_classes(config):  # a causal LM head first, then a masked LM head (BERT-style encoders)
        try:
            if weights:
                model = auto.from_pretrained(str(folder), local_files_only=True, **load)
            else:
                torch.manual_seed(seed)
                model = auto.from_config(config, **load)
            break
        except ImportError as exc:  # a kernel transformers knows but this machine lacks (flash_attention_2)
            raise AttnlabError(f"attn_implementation={attn_implementation!r} cannot run here: "
                               f"{' '.join(str(exc).split())[:300]}") from None
        except ValueError as exc:  # "Unrecognized configuration class ... for this kind of AutoModel"
            errors.append(f"{auto.__name__}: {' '.join(str(exc).split())[:200]}")
    else:
        raise AttnlabError(f"--hf {path}: model_type {config.model_type!r} has no causal, masked or seq2seq LM head "
                           f"in transformers ({'; '.join(errors)})")
    if dev is not None:
        model.to(dev)  # our own fresh copy: moved in place
    tokenizer = folder if path.is_dir() and _has_tokenizer(folder) else None
    source = {"source": "hf", "path": str(path.resolve()),
              "weights": "pretrained" if weights else f"random (seed {seed})", "class": type(model).__name__}
    return model, source, tokenizer


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json",
                                                        "tokenizer.model", "vocab.txt"))


# --- --model module:callable ---------------------------------------------------------------------
def load_factory(spec: str) -> tuple[Any, dict[str, Any]]:
    """Import ``module:callable`` (the current folder first on ``sys.path``), call it, return what it made."""
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name.strip() or not attr.strip() or ":" in attr:
        raise AttnlabError(f"--model {spec!r} is not of the form module:callable (e.g. mymodels:build)")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AttnlabError(f"--model {spec!r}: module {module_name!r} cannot be imported from {cwd} ({exc})") from None
    except Exception as exc:  # the user's module raised while importing: one line naming it
        raise AttnlabError(f"--model {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise AttnlabError(f"--model {spec!r}: {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise AttnlabError(f"--model {spec!r}: {attr!r} is a {type(target).__name__}, not a callable factory")
    try:
        made = target()
    except Exception as exc:  # the user's factory failed: one line naming the exception
        raise AttnlabError(f"--model {spec!r}: calling {attr}() raised {type(exc).__name__}: {exc}") from None
    return made, {"source": "model", "factory": str(spec)}


def _as_model(made: Any, spec: str) -> Any:
    """What a factory returned, behind the protocol: wrapped, a (module, cfg) pair as a FunctionModel."""
    if isinstance(made, tuple) and len(made) == 2 and callable(made[0]) and not isinstance(made[1], type):
        return FunctionModel(made[0], made[1])
    if needs_adapter(made) or (isinstance(made, HookedRootModule) and hasattr(made, "cfg")):
        return adapt(made)
    raise AttnlabTypeError(f"--model {spec!r} returned a {type(made).__name__}: expected a protocol model "
                           f"(HookedRootModule with cfg), a transformers PreTrainedModel, a TransformerBridge or a "
                           f"pair (nn.Module or function, cfg)")


# --- both ----------------------------------------------------------------------------------------
def open_model(hf: Optional[str] = None, factory: Optional[str] = None, seed: int = 0, *,
               dtype: Optional[str] = None, device: Any = None,
               attn_implementation: Optional[str] = None) -> ExternalModel:
    """The model of ``--hf`` or ``--model`` (exactly one), wrapped, placed and smoke-tested, with its card.

    ``dtype``/``device``/``attn_implementation``: where it runs (``--hf`` loads it there; a factory's
    model is placed by :func:`harness.adapters.placed`, a copy); the card records what ran.
    """
    if (hf is None) == (factory is None):
        raise AttnlabError("give exactly one of --hf PATH and --model module:callable")
    check_placement(dtype, device)
    tokenizer = None
    if hf is not None:
        raw, source, tokenizer = load_hf(hf, seed, dtype=dtype, device=device, attn_implementation=attn_implementation)
        model = adapt(raw)  # HFAdapter: refuses an unsupported architecture and smoke-tests the forward
    else:
        assert factory is not None
        made, source = load_factory(factory)
        model = placed(_as_model(made, factory), dtype=dtype, device=device, attn_implementation=attn_implementation)
    source["dtype_requested"] = dtype or "auto"  # what the user asked; the card's "dtype" is what ran
    # cfg fields, hook_dict and the forward's arguments, then the two-token smoke forward (a model that raises
    # in it is one error naming the exception), before any work
    check_protocol(model, hooks=False)
    return ExternalModel(model, model_card(model, source), tokenizer)


def model_card(model: Any, source: dict[str, Any]) -> dict[str, Any]:
    """What ``model.json`` records: source, adapter, architecture, route, parameters, what ran (``dtype``,
    ``device``, ``attn_implementation``: :func:`harness.adapters.placement_of`) and the design facts."""
    cfg = model.cfg
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        facts = dataclasses.asdict(cfg)
    else:
        facts = {k: v for k, v in vars(cfg).items() if not k.startswith("_")} if hasattr(cfg, "__dict__") else {}
    facts = {k: _jsonable(v) for k, v in facts.items()}
    inner = getattr(model, "hf_model", None) or getattr(model, "bridge", None) or model
    params = sum(p.numel() for p in inner.parameters()) if hasattr(inner, "parameters") else None
    return {**source, "adapter": describe(model), "arch": facts.get("arch", type(inner).__name__),
            "route": getattr(model, "route", None), "parameters": params, **placement_of(model), "design": facts}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def prepare_out(out: str | os.PathLike) -> Path:
    """The run directory an external model's results go to (not created yet); refused if it holds a trained run."""
    layout = RunDir(out)
    if layout.path.exists() and not layout.path.is_dir():
        raise AttnlabError(f"--out {layout.path} is a file: expected a folder")
    if layout.checkpoint.exists() or layout.metrics_csv.exists():
        raise AttnlabError(f"--out {layout.path} holds a trained run (checkpoint/ or metrics.csv): --hf/--model write "
                           f"another model's results, which would mix with that run's; choose another folder")
    return layout.path


def write_card(run_dir: Path, card: dict[str, Any]) -> Path:
    return atomic_write_json(RunDir(run_dir).model_json, card, indent=1)


# --- probe data ----------------------------------------------------------------------------------
def task_tokens(model: Any, task: str, sequences: int, seed: int) -> tuple[Any, Any]:
    """``(tokens, loss_mask)``: a validation batch of the harness task ``task`` at the model's vocab and n_ctx."""
    cfg = model.cfg
    # the task's own length when the model's context allows it, else the whole context
    seq_len = min(TASKS[task].default_seq_len, cfg.n_ctx) if task in TASKS else None
    made = make_task(task, cfg.d_vocab, cfg.n_ctx, seq_len)
    return made.batch(sequences, torch.Generator().manual_seed(seed), "val")


def seq2seq_tokens(model: Any, task: str, sequences: int, seed: int) -> tuple[Any, Any, dict[str, Any]]:
    """``(decoder tokens, loss_mask, source keywords)``: a validation batch of the source -> target task ``task``
    (:class:`harness.training.seq2seq_task.Seq2SeqTask`: reverse or sort a padded source) within the model's
    vocabulary and context, for an encoder-decoder. The loss counts the decoder's target tokens."""
    if task not in Seq2SeqTask.KINDS:
        raise AttnlabError(f"--task {task} is a decoder-only task, and the model is an encoder-decoder: expected a "
                           f"source -> target task, --task one of {', '.join(Seq2SeqTask.KINDS)}")
    cfg, default = model.cfg, Seq2SeqTask(task)
    made = Seq2SeqTask(task, n_symbols=min(default.n_symbols, cfg.d_vocab - FIRST_SYMBOL),
                       max_len=min(default.max_len, cfg.n_ctx - 1))
    batch = made.batch(sequences, torch.Generator().manual_seed(seed))
    return batch.decoder_input, batch.loss_mask, {"source_tokens": batch.source, "source_mask": batch.source_mask}


def probe_tokens(ext: ExternalModel, task: Optional[str], text_file: Optional[str], sequences: int,
                 seed: int) -> tuple[tuple[Any, Any], Optional[dict[str, Any]]]:
    """``((tokens, loss_mask), source keywords or None)`` that ``attnlab probe --hf/--model`` probes the model on:
    ``--task NAME``'s batch (an encoder-decoder's from :func:`seq2seq_tokens`, with its source), or ``--text FILE``
    (:func:`text_tokens`; a decoder-only model's: text gives an encoder-decoder no source)."""
    if is_encoder_decoder(ext.model):
        if task is None:
            raise AttnlabError(f"--text {text_file} gives no source, and the model is an encoder-decoder: expected "
                               f"--task one of {', '.join(Seq2SeqTask.KINDS)} (a source -> target task)")
        tokens, loss_mask, source = seq2seq_tokens(ext.model, task, sequences, seed)
        return (tokens, loss_mask), source
    if task is not None:
        return task_tokens(ext.model, task, sequences, seed), None
    return text_tokens(ext, str(text_file), sequences, TEXT_SEQ_LEN), None


def text_tokens(ext: ExternalModel, text_file: str | os.PathLike, sequences: int, seq_len: int) -> tuple[Any, None]:
    """``(tokens, None)``: ``text_file`` tokenized by the --hf folder's tokenizer, cut into ``seq_len`` pieces."""
    path = Path(text_file)
    if ext.tokenizer_path is None:
        what = "a --model factory has no tokenizer" if ext.card.get("source") == "model" else \
            f"{ext.card.get('path')} holds no tokenizer (tokenizer.json / tokenizer_config.json)"
        raise AttnlabError(f"--text {path} needs the model's tokenizer, but {what}: save the tokenizer with the model "
                           f"(tokenizer.save_pretrained) or use --task NAME")
    if not path.is_file():
        raise FileNotFoundError(f"--text {path} does not exist or is not a file: expected a UTF-8 text file")
    tokenizer = AutoTokenizer.from_pretrained(str(ext.tokenizer_path), local_files_only=True)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise AttnlabError(f"--text {path} is not UTF-8 text ({exc})") from None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    n_ctx, d_vocab = ext.model.cfg.n_ctx, ext.model.cfg.d_vocab
    length = min(seq_len, n_ctx, len(ids))
    if length < 2:
        raise AttnlabError(f"--text {path} has {len(ids)} token(s): expected at least 2")
    if max(ids) >= d_vocab:
        raise AttnlabError(f"--text {path}: the tokenizer gives id {max(ids)}, past the model's vocabulary "
                           f"(d_vocab={d_vocab}): expected the model's own tokenizer")
    n = max(1, min(sequences, len(ids) // length))
    return torch.tensor(ids[:n * length], dtype=torch.long).view(n, length), None


# --- the command line's rule ---------------------------------------------------------------------
def resolve(run_dir: Optional[str], out: Optional[str], hf: Optional[str], factory: Optional[str],
            seed: int = 0, **where: Any) -> tuple[str, Optional[ExternalModel]]:
    """``(run directory, external model or None)`` for ``attnlab check``/``probe``; every refusal before any work.

    The rule: a trained run is the ``RUN_DIR`` argument alone. ``--hf PATH`` or ``--model module:callable``
    (not both) checks another model and writes into ``--out RUN_DIR`` (the ``RUN_DIR`` argument is
    accepted in its place); that folder must not hold a trained run's checkpoint or metrics, which
    would mix two models' results in one report. ``where`` (dtype, device, attn_implementation) goes to
    :func:`open_model`.
    """
    if hf is not None and factory is not None:
        raise AttnlabError(f"--hf {hf} and --model {factory} were both given: expected one model, either a Hugging "
                           f"Face folder (--hf) or a factory (--model)")
    if hf is None and factory is None:
        if out is not None:
            raise AttnlabError(f"--out {out} is for --hf/--model (another model's results); a trained run is given "
                               f"as the RUN_DIR argument alone")
        if run_dir is None:
            raise AttnlabError("missing RUN_DIR: expected a trained run directory, or --hf PATH / --model "
                               "module:callable with --out RUN_DIR")
        return run_dir, None
    if run_dir is not None and out is not None and Path(run_dir) != Path(out):
        raise AttnlabError(f"RUN_DIR {run_dir} and --out {out} differ: expected one run directory")
    target = out if out is not None else run_dir
    if target is None:
        raise AttnlabError(f"{'--hf' if hf is not None else '--model'} needs --out RUN_DIR: the run directory to write "
                           f"into")
    path = prepare_out(target)
    return str(path), open_model(hf=hf, factory=factory, seed=seed, **where)


def save(run_dir: str | os.PathLike, ext: ExternalModel) -> Path:
    """Create the run directory and write the model's card into it (once every input has been checked)."""
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    return write_card(path, ext.card)
