"""What ``attnlab census`` does (reports/cli.py maps its options onto :func:`run`)."""

from __future__ import annotations

import difflib
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import pandas as pd
import transformers

from harness.errors import AttnlabError
from reports.census import bridge as census_bridge
from reports.census import conformance, render
from reports.census.classify import Result
from reports.census.enumerate import ModelType, by_name
from reports.census.executor import open_executor
from reports.census.run import TIMEOUT_S, cache_key, census

__all__ = ["DOC", "TIMEOUT_S", "frame", "run", "select"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def select(only: tuple[str, ...]) -> list[ModelType]:
    """The model types named by ``--only`` (all when none); an unknown one is an error listing the close matches."""
    known = by_name()
    if not only:
        return list(known.values())
    for name in only:
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=5, cutoff=0.6)
            hint = f"close matches: {', '.join(close)}" if close else f"expected one of the {len(known)} model types " \
                "of the causal/masked/seq2seq LM auto mappings (attnlab census lists them)"
            raise AttnlabError(f"--only {name!r} is not a model type transformers {transformers.__version__} maps for "
                               f"causal, masked or seq2seq LM; {hint}")
    return [known[n] for n in only]


def frame(results: list[Result], raw: Optional[conformance.Raw] = None) -> pd.DataFrame:
    """One row per model type: category, reason, route, hooks, seconds, and one column per property's status
    (with ``raw``, the bridge census: also the raw category and the rows that differ)."""
    rows = [{"model_type": r.model_type, "head": r.class_name, "category": r.category, "reason": r.reason,
             "route": r.route, "hooks": " ".join(r.hooks), "seconds": r.seconds,
             **({} if raw is None else {"raw_category": raw.get(r.model_type, {}).get("category", ""),
                                        "differences": "; ".join(conformance.differences(
                                            raw.get(r.model_type, {}), r))}), **r.rows} for r in results]
    return pd.DataFrame(rows)


def run(only: tuple[str, ...] = (), *, workers: int = 1, timeout_s: int = TIMEOUT_S, use_cache: bool = True,
        out: Optional[Path] = None, write_docs: Optional[Path] = None,
        echo: Callable[[str], None] = print, bridge: bool = False, executor: str = "local",
        address: Optional[str] = None) -> list[Result]:
    """Run the census (``only`` limits it; through TransformerLens's bridge when ``bridge``) on ``executor`` (local:
    ``workers`` processes; ray: Ray tasks, on the cluster at ``address`` or a local instance), print a line per model
    type and the summary, write what was asked."""
    if workers < 1 or workers > (os.cpu_count() or 1) * 4:
        raise AttnlabError(f"--workers {workers} is invalid: expected 1..{(os.cpu_count() or 1) * 4}")
    if timeout_s < 1:
        raise AttnlabError(f"--timeout {timeout_s} is invalid: expected a positive number of seconds")
    types = select(only)
    if write_docs is not None and only:
        raise AttnlabError("--write-docs writes the whole census: drop --only")
    with open_executor(executor, workers=workers, address=address,
                       fingerprint=functools.partial(cache_key, bridge)) as pool:
        start = time.perf_counter()
        results = census(types, timeout_s=timeout_s, use_cache=use_cache, bridge=bridge, pool=pool,
                         progress=lambda r: echo(f"{r.model_type:28s} {r.category:18s} {r.seconds:6.1f}s {r.reason}"))
        wall = time.perf_counter() - start
        ran = f"This run: {wall:.0f} s wall on {pool.describe()}, {sum(r.seconds for r in results):.0f} s of model " \
              f"time."
    if bridge:
        return _bridge_report(results, ran, out, write_docs, echo)
    echo(render.summary_line(results).replace("**", "") + " " + ran)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        frame(results).to_csv(out, index=False)
    if write_docs is not None:
        render.write_docs(results, write_docs, transformers.__version__, ran)
    return results


def _bridge_report(results: list[Result], ran: str, out: Optional[Path], write_docs: Optional[Path],
                   echo: Callable[[str], None]) -> list[Result]:
    """The bridge census against the stored raw census: the summary, a line per model type that differs."""
    raw = conformance.load_raw(write_docs or DOC)
    for r in results:
        before = raw.get(r.model_type, {}).get("category", "-")
        diff = conformance.differences(raw.get(r.model_type, {}), r)
        if before != r.category or diff:
            echo(f"{r.model_type:28s} raw {before} → bridge {r.category}" + (f": {'; '.join(diff)}" if diff else ""))
    echo(conformance.summary_line(results).replace("**", "") + " " + ran)
    echo(conformance.agreement_line(results, raw))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        frame(results, raw).to_csv(out, index=False)
    if write_docs is not None:
        versions = {"transformers": transformers.__version__, "transformer_lens": census_bridge.version()}
        conformance.write_docs(results, raw, write_docs, versions, ran)
    return results
