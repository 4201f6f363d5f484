"""What ``attnlab census --variants N`` does: draw N configs per model type, run them, triage, report.

``python -m reports.census.variants_command`` re-derives the stored rows' verdicts from today's findings.py
(:func:`retriage_docs`: no model is run) and rewrites the docs section, for a finding added after the run.

The default types are :data:`DECODERS` and :data:`ENCODER_DECODERS` (only those the installed transformers
maps); ``--only`` picks others. Rows are printed one a line as they finish, then a summary per category;
``--write-docs`` writes docs/census_variants.json and the "Configuration variants" section of docs/models.md
(reports/census/variants_render.py).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import transformers

from harness.errors import AttnlabError
from reports.census import variants_render
from reports.census.command import DOC, select
from reports.census.enumerate import ModelType, by_name
from reports.census.executor import open_executor
from reports.census.run import cache_key
from reports.census.variants import draw
from reports.census.variants_run import CATEGORIES, DTYPES, TIMEOUT_S, Job, Row, retriage, run_jobs

# The decoder families most used on the Hugging Face Hub, by the architecture of their checkpoints (the llama,
# mistral, qwen, gemma, phi, gpt-2/neox/j, falcon, mpt, bloom, opt ... fine-tunes make up most of the Hub's text
# generation models): a fixed list, so a run covers the same types on every machine.
DECODERS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "gpt2",
            "gpt_neox", "falcon", "mpt", "bloom", "opt", "gptj", "starcoder2", "cohere", "cohere2", "olmo", "olmo2",
            "stablelm", "mixtral", "qwen2_moe", "deepseek_v3", "glm", "glm4", "granite", "exaone", "exaone4",
            "qwen3_moe", "gpt_neo", "codegen", "gpt_bigcode", "persimmon", "phimoe", "olmoe", "granitemoe",
            "smollm3", "jetmoe")
# The encoder-decoders HFSeq2SeqAdapter checks (their census route is the cross-attention one; the rest of the
# seq2seq mapping wraps audio or vision encoders).
ENCODER_DECODERS = ("t5", "mt5", "umt5", "switch_transformers", "longt5", "m2m_100", "nllb-moe", "pegasus_x")
DEFAULT_SEED = 0


def default_types() -> list[ModelType]:
    known = by_name()
    return [known[n] for n in (*DECODERS, *ENCODER_DECODERS) if n in known]


def jobs(types: list[ModelType], n: int, seed: int, dtypes: tuple[str, ...],
         dtype_variants: Optional[int] = None) -> list[Job]:
    """``n`` drawn configs of each type (variants.draw), each at ``dtypes[0]``; the first ``dtype_variants`` of them
    (all when None) also at the other dtypes."""
    out: list[Job] = []
    for mt in types:
        for i, changes in enumerate(draw(mt.name, mt.class_name, n, seed)):
            at = dtypes if dtype_variants is None or i < dtype_variants else dtypes[:1]
            out.extend(Job(mt.name, mt.task, mt.class_name, i, dtype, changes) for dtype in at)
    return out


def line(row: Row) -> str:
    job, r = row.job, row.result
    text = f"{job['model_type']:20s} #{job['index']:<3d} {job['dtype']:8s} {r['category']:18s} {r['seconds']:6.1f}s " \
           f"{r['reason']}"
    if row.minimal is not None:
        text += f" | minimal: {row.minimal}"
    return text


def summary_line(rows: list[Row]) -> str:
    counts = Counter(r.category for r in rows)
    configs = {(r.job["model_type"], r.job["index"]) for r in rows}
    types = {r.job["model_type"] for r in rows}
    return (f"{len(configs)} drawn configs of {len(types)} model types, {len(rows)} checks: "
            + ", ".join(f"{c} {counts[c]}" for c in CATEGORIES if counts[c]) + ".")


def run(n: int, only: tuple[str, ...] = (), *, seed: int = DEFAULT_SEED, dtypes: tuple[str, ...] = ("float32",),
        dtype_variants: Optional[int] = None, workers: int = 1, timeout_s: int = TIMEOUT_S, use_cache: bool = True,
        write_docs: Optional[Path] = None, echo: Callable[[str], None] = print, executor: str = "local",
        address: Optional[str] = None) -> list[Row]:
    """Draw ``n`` configs per type and check each at the first dtype, the first ``dtype_variants`` (all when None)
    at every dtype, on ``executor`` (as the census's: local ``workers`` or Ray at ``address``); print a line per check
    and the summary."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise AttnlabError(f"--variants {n!r} is invalid: expected a positive integer (configs drawn per model type)")
    if dtype_variants is not None and (isinstance(dtype_variants, bool) or not 0 <= dtype_variants <= n):
        raise AttnlabError(f"--dtype-variants {dtype_variants!r} is invalid: expected 0..{n} (of the --variants)")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise AttnlabError(f"--dtype {bad or list(dtypes)} is invalid: expected some of {list(DTYPES)}")
    if write_docs is not None and only:
        raise AttnlabError("--write-docs writes the whole variants census: drop --only")
    types = select(only) if only else default_types()
    todo = jobs(types, n, seed, dtypes, dtype_variants)
    with open_executor(executor, workers=workers, address=address, fingerprint=cache_key) as pool:
        start = time.perf_counter()
        rows = run_jobs(todo, timeout_s=timeout_s, use_cache=use_cache, progress=lambda row: echo(line(row)),
                        pool=pool)
        wall = time.perf_counter() - start
        ran = f"This run: {wall:.0f} s wall on {pool.describe()}, " \
              f"{sum(r.result['seconds'] for r in rows):.0f} s of model time (first attempts)."
    echo(summary_line(rows) + " " + ran)
    if write_docs is not None:
        variants_render.write_docs(rows, write_docs, transformers.__version__,
                                   {"variants": n, "seed": seed, "dtypes": list(dtypes),
                                    "dtype_variants": n if dtype_variants is None else dtype_variants, "wall": ran})
    return rows


def retriage_docs(doc: Path = DOC) -> list[Row]:
    """Re-derive the verdicts of the rows stored beside ``doc`` from today's findings (variants_run.retriage) and
    rewrite the variants section and its JSON; the check results stay the stored run's."""
    stored = json.loads((doc.parent / variants_render.RESULTS).read_text())
    rows = [retriage(Row.from_json(r)) for r in stored.pop("rows")]
    version = stored.pop("transformers")
    variants_render.write_docs(rows, doc, version, stored)
    return rows


if __name__ == "__main__":
    print(summary_line(retriage_docs()))
