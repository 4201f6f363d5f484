"""Decode-step time against cache length: the preallocated in-place cache vs the torch.cat growth it replaced.

One decode step (one new token, every layer) at a short and a long cached length, for our cache and
for a reference entry that grows by ``torch.cat`` (what ``KVCacheEntry`` did before), timed side by
side, interleaved. A cat step copies the whole cache, so its step time grows with the length; ours
writes one position in place, so its step time is flat but for the attention over more keys.
"""

from __future__ import annotations

import pytest
import torch

from harness import KVCache, ModelConfig, Transformer
from harness.model.kv_cache import KVCacheEntry
from reports.bench.core import interleaved_times, medians, paired_ratio
from tests.bench.common import FULL, report

pytestmark = pytest.mark.bench

SHORT, LONG = 64, 4096


class CatEntry(KVCacheEntry):
    """The reference: keys and values grown by ``torch.cat`` at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.k_cat = self.v_cat = None

    def extend(self, k, v):
        if self.k_cat is not None:
            k, v = torch.cat((self.k_cat, k), dim=2), torch.cat((self.v_cat, v), dim=2)
        self.k_cat, self.v_cat, self.length = k, v, k.shape[2]
        return k, v

    def truncate(self, length: int) -> None:
        self.k_cat, self.v_cat, self.length = self.k_cat[:, :, :length], self.v_cat[:, :, :length], length


def _decoder(model: Transformer, prompt: torch.Tensor, length: int, cat: bool):
    """A decode step at ``length`` cached tokens, repeatable: the cache is cut back to ``length`` first."""
    cache = KVCache(model.cfg.n_layers, capacity=None if cat else length + 1)
    if cat:
        cache.layers = [CatEntry() for _ in cache.layers]
    with torch.no_grad():
        model(prompt[:, :length], kv_cache=cache)
    nxt = prompt[:, length:length + 1]

    def step() -> None:
        cache.length = length
        for entry in cache.layers:
            if cat:
                entry.truncate(length)
            else:
                entry.length = length
        with torch.no_grad():
            model(nxt, kv_cache=cache)
    return step


def test_decode_step_does_not_slow_down_with_length(benchmark, one_thread):
    model = Transformer(ModelConfig(n_layers=2, d_model=256, n_heads=8, d_vocab=64, n_ctx=LONG + 1,
                                    positional_embedding_type="rotary", seed=0)).eval()
    prompt = torch.randint(0, 64, (1, LONG + 1), generator=torch.Generator().manual_seed(0))
    fns = {f"{kind}_{n}": _decoder(model, prompt, n, kind == "cat") for kind in ("ours", "cat") for n in (SHORT, LONG)}
    times = interleaved_times(fns, rounds=40 if FULL else 15, warmup=3)
    ours_growth = paired_ratio(times, f"ours_{LONG}", f"ours_{SHORT}")
    cat_growth = paired_ratio(times, f"cat_{LONG}", f"cat_{SHORT}")
    speedup = paired_ratio(times, f"cat_{LONG}", f"ours_{LONG}")
    med = medians(times)
    report(benchmark, f"decode step at {SHORT} vs {LONG} cached tokens (L2 d256 H8)",
           ours_short_ms=med[f"ours_{SHORT}"] * 1e3, ours_long_ms=med[f"ours_{LONG}"] * 1e3,
           cat_short_ms=med[f"cat_{SHORT}"] * 1e3, cat_long_ms=med[f"cat_{LONG}"] * 1e3,
           ours_growth=ours_growth, cat_growth=cat_growth, speedup_at_long=speedup)
    benchmark.pedantic(fns[f"ours_{LONG}"], rounds=3, iterations=1)
    # the in-place cache's step grows less with length than the cat cache's, measured side by side
    assert ours_growth < cat_growth, (ours_growth, cat_growth)
    assert speedup > 1.0, f"the preallocated cache is slower than cat growth at {LONG} tokens: {speedup:.2f}x"
