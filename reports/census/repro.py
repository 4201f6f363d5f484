"""Standalone reproductions of the census's live findings: one Python file per (witness, model type).

A finding's witness (tests/helpers/census_witness.py, census_variant_witness.py) shows the bug through attnlab's
helpers; a maintainer of transformers or TransformerLens should not need attnlab to see it. Each file written here
imports only torch and transformers (and transformer_lens for a bridge finding: the bug is in it), builds the census's
tiny config literally (``CONFIG``; a variant finding's minimal failing changes applied), seeds the random weights,
runs the witness's minimal input, prints expected against observed with numbers and exits 1 while the bug is present,
0 once fixed (2: a control failed). The bodies are one per witness kind (reports/census/repro_templates*.py); the
modeling lines at fault are found in the installed source at generation time (reports/census/repro_sites.py).

``attnlab census --repro TYPE`` writes a type's files; ``python -m reports.census.repro --write-docs`` regenerates
docs/findings/ (every live finding, and README.md with each script's output: it runs them to record it).
"""

from __future__ import annotations

import argparse
import inspect
import pprint
import string
import textwrap
from pathlib import Path
from typing import Any

import torch
import transformers

from reports.census import bridge as census_bridge
from reports.census import repro_readme, repro_templates, repro_templates_more
from reports.census.enumerate import by_name
from reports.census.repro_run import run_all
from reports.census.repro_select import CLAIMS, DOCS, Repro, config_values, for_type, live
from reports.census.repro_sites import SITES

FINDINGS_DIR = DOCS / "findings"
TEMPLATES = {**repro_templates.BY_WITNESS, **repro_templates_more.BY_WITNESS}
BRIDGE_KINDS = ("bridge_not_causal", "bridge_attn_scores_is_pattern", "bridge_z_is_o_proj_input",
                "bridge_v_before_v_norm")
# float64 unless rounding is the point (inv_freq) or the census that found it ran float32 (the bridge census)
DTYPES: dict[object, str] = {**dict.fromkeys(BRIDGE_KINDS, "float32"), "inv_freq_rounded_by_to": "float32",
          # ProphetNet in float64 turns a masked left pad into NaN at the real tokens (float32: finite), which would
          # hide the positions' shift: its left-pad witness runs float32, as the census's did
          ("left_padding_moves_positions", "prophetnet"): "float32"}
STEPS = {"afmoe": "AFMoE's sigmoid output gate", "bitnet": "BitNet's attn_sub_norm over all heads"}
SOURCES = {"census": "the census's", "variants": "the variants census's", "bridge": "the bridge census's"}
WITNESS_FILES = {"census": "tests/helpers/census_witness.py", "bridge": "tests/helpers/census_witness.py",
                 "variants": "tests/helpers/census_variant_witness.py"}


def _literal(value: Any, indent: int) -> str:
    return pprint.pformat(value, width=118 - indent, sort_dicts=True).replace("\n", "\n" + " " * indent)


def _placeholders(repro: Repro, class_name: str) -> dict[str, str]:
    params = inspect.signature(getattr(transformers, class_name).forward).parameters
    rope = repro.changes.get("rope_parameters", {})
    plain = {k: v for k, v in rope.items() if k in ("rope_theta", "partial_rotary_factor")}
    return {"CACHED": str("kv_cache" in repro.props),
            "POSITION_KW": '{"position_ids": torch.tensor([[0, 0, 1]])}' if "position_ids" in params else "{}",
            "CACHE_ARG": "cache" if "cache" in params else "past_key_values",
            "LONGROPE": _literal(rope, 11), "DEFAULT_ROPE": _literal({**plain, "rope_type": "default"}, 10),
            "MODELING": getattr(transformers, class_name).__module__,
            "STEP": STEPS.get(repro.model_type, "a step after the kernel")}


def versions(repro: Repro) -> str:
    tl = f", transformer_lens {census_bridge.version()}" if repro.witness in BRIDGE_KINDS else ""
    return f"transformers {transformers.__version__}, torch {torch.__version__}{tl}"


def _docstring(repro: Repro, class_name: str, sites: list[str]) -> str:
    props = ", ".join(repro.props)
    wrap = lambda text: textwrap.fill(text, 116)  # noqa: E731
    lines = [f"{repro.model_type} ({class_name}): {props} -- {SOURCES[repro.source]} finding, standalone.", "",
             wrap(repro.findings[0].summary), ""]
    if repro.witness in BRIDGE_KINDS:
        lines += [wrap("This one needs transformer_lens: the bug is in TransformerLens's bridge (the raw transformers "
                       "model is the reference it is compared with)."), ""]
    lines += [wrap(f"Made with {versions(repro)}. The model is the census's tiny random {class_name}: CONFIG below, "
                   f"weights from torch.manual_seed(0), no download. Witness in attnlab: "
                   f"{WITNESS_FILES[repro.source]}::{repro.witness}."), "",
              wrap(f"Expected: {CLAIMS[repro.witness][0]}. Observed: {CLAIMS[repro.witness][1]} (the script prints "
                   "both, with the numbers)."), "",
              "Lines at fault (the installed source when this file was made):",
              *(f"  {s}" for s in sites), "",
              f"Run: python {repro.filename}  (exit 1 while the bug is present, 0 once it is fixed, 2 when a control",
              "the witness relies on fails)."]
    return '"""' + "\n".join(lines) + '\n"""'


def _header(repro: Repro, class_name: str) -> str:
    config_class = getattr(transformers, class_name).config_class.__name__
    dtype = DTYPES.get((repro.witness, repro.model_type), DTYPES.get(repro.witness, "float64"))
    why = ("the bridge census's dtype" if repro.witness in BRIDGE_KINDS else "each use picks its dtype"
           if repro.witness == "inv_freq_rounded_by_to" else "float64 gives NaN after a masked pad"
           if dtype == "float32" else "no rounding can blur the evidence")
    return f'''
import sys

import torch
import transformers

transformers.logging.set_verbosity_error()  # keep the output to the evidence

# The census's tiny {repro.model_type}: the default config with every size shrunk and the structure kept.
CONFIG = {_literal(config_values(repro), 9)}
DTYPE = torch.{dtype}  # {why}


def build(dtype=DTYPE, **changes):
    """The tiny random model: CONFIG with ``changes``, weights drawn from seed 0, in eval mode."""
    config = transformers.{config_class}(**{{**CONFIG, **changes}})
    torch.manual_seed(0)
    model = transformers.{class_name}._from_config(config, dtype=dtype)
    if dtype == torch.float64 and getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    return model.eval()


'''


def render(repro: Repro) -> str:
    """The script's text: docstring, header, the witness kind's body, the verdict."""
    class_name = by_name()[repro.model_type].class_name
    sites = SITES[repro.witness](repro.model_type, class_name)
    body = string.Template(TEMPLATES[repro.witness]).substitute(_placeholders(repro, class_name))
    return _docstring(repro, class_name, sites) + "\n" + _header(repro, class_name) + body.lstrip("\n") + \
        repro_templates.VERDICT


def write(repros: list[Repro], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for repro in repros:
        path = out_dir / repro.filename
        path.write_text(render(repro))
        paths.append(path)
    return paths


def write_type(model_type: str, out_dir: Path) -> list[Path]:
    """``attnlab census --repro TYPE``: the scripts of every live finding of ``model_type``."""
    return write(for_type(model_type), out_dir)


def write_docs(out_dir: Path = FINDINGS_DIR, workers: int = 2) -> list[Path]:
    """Every live finding's script into ``out_dir``, run once each to record its output in README.md; scripts of
    findings no longer live are removed (only this generator's ``TYPE__witness.py`` files)."""
    repros = live()
    for stale in out_dir.glob("*__*.py"):
        if stale.name not in {r.filename for r in repros}:
            stale.unlink()
    paths = write(repros, out_dir)
    outputs = run_all(paths, workers=workers)
    (out_dir / "README.md").write_text(repro_readme.render(repros, outputs, {r.filename: SITES[r.witness](
        r.model_type, by_name()[r.model_type].class_name) for r in repros}, versions))
    return [*paths, out_dir / "README.md"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m reports.census.repro", description=__doc__.split("\n")[0])
    parser.add_argument("--write-docs", action="store_true", help="regenerate docs/findings/ (runs every script)")
    parser.add_argument("--out", type=Path, default=FINDINGS_DIR, help="the folder (default: docs/findings)")
    parser.add_argument("--workers", type=int, default=2, help="scripts run at once")
    args = parser.parse_args(argv)
    if not args.write_docs:
        parser.error("nothing to do: pass --write-docs (attnlab census --repro TYPE writes one type's scripts)")
    for path in write_docs(args.out, args.workers):
        print(path)


if __name__ == "__main__":
    main()
