"""How many examples a property's search runs when the caller leaves ``max_examples`` to it.

A search's cost is its forward passes, and on CPU a pass over a few short sequences costs what it
takes to read the model's weights once: on GPT-2 small's shape (124M parameters, float32) one
pass over [2, 8] tokens took 0.22 s and over [1, 8] 0.21 s, its float64 twin's 0.33 s (2 loaded
cores); SmolLM2-135M 0.13 s and 0.20 s. The example count that a 1M-parameter model runs in a
second would take a 135M one minutes per property. So, when ``max_examples`` is None, every
property row gets the same budget of weight reads, :data:`ROW_BUDGET` bytes: a pass of the model
costs its parameter bytes (at least 4 per parameter: bfloat16/float16 compute on CPU is no
faster than float32), a pass of a golden copy (properties/precision.py) 8 per parameter (its
float64 twin; a float32 fallback costs less, counted the same). The search first measures the
simplest input alone (hypothesis draws it first in any search), and runs as many examples as the
budget pays for at that price, at least :data:`MIN_EXAMPLES` (properties/registry.py: the count is
chosen before the search, because hypothesis plans a search by its size: under 10 examples it
draws at random from the second on, where a larger search spends its first ones on zero-extended
inputs such as a batch of identical all-zero rows); a search whose examples cost more than the
first stops drawing once the budget is spent. Exact rows (no twin, one pass per example) keep
more examples than calibrated ones.

A row that draws long sequences (a sliding window of thousands of keys needs inputs longer than it)
pays for its attention too: each pass also costs the bytes of its attention patterns,
``n_layers * n_heads * n^2`` float32 weights for ``n`` tokens (float64 in a twin pass), each byte
priced :data:`PATTERN_BYTE_COST` weight bytes. Past a few hundred tokens they outweigh a tiny
model's weights: Gemma-2's default window of 4096 makes 0.54 GB of patterns a pass for a 2-layer,
4-head model of 0.1 MB of weights, and that pass took 12 s with its patterns captured (load ~5),
where reading GPT-2 small's 0.5 GB of weights takes 0.22 s: ~50x a byte.

What the cost is counted from is the model's size and the row's pass counts (properties/cost.py),
not a clock: the same seed runs the same examples on any machine at any load. Small models are
never cut: a row whose planned examples cannot exceed the budget at :data:`MAX_PASSES` passes
each (below ~1.8M float32 parameters at 25 examples) runs the very search it ran without one (the
mutant kill matrix, the field-bug catalogue, the zoo). A found failure is shrunk without a
budget, so a red row's counterexample is as minimal as without one. An explicit ``max_examples``
is run exactly. When the budget cuts a passing row's search, its reason says how many examples
ran (:meth:`Budget.text`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Optional

from properties.cost import Cost
from properties.design import model_dtype

# bytes of weights read per property row: GPT-2 small's shape in float32 (0.5 GB a pass, 1 GB a twin pass) gets
# 2 examples of a logit row (2 passes + 2 twin passes each) or of a one-pass calibrated row, 8 of an exact row
# (the figures: tests/bench/test_bench_suite.py)
ROW_BUDGET = 4 * 2**30
PATTERN_BYTE_COST = 50  # a byte of attention patterns, in weight bytes read (measured: the module doc)
MIN_EXAMPLES = 3  # the simplest input (hypothesis draws it first) and two random ones
TWIN_BYTES = 8  # per parameter: the float64 twin
# passes an example may take, at most (batch_independence: a batch of 3 and each row alone; finite_outputs with
# <bos>: 4): a row whose planned examples cannot exceed the budget at this many is searched as without one
MAX_PASSES = 8


# True inside check_model(..., budget=True): an explicit max_examples is then a cap the row's budget may lower
# (`attnlab check --max-examples N`), not an exact count
_CAP: ContextVar[bool] = ContextVar("attnlab_budget_caps_max_examples", default=False)


@contextmanager
def capping(on: bool) -> Iterator[None]:
    """Within the block an explicit ``max_examples`` is budgeted like a default one (``on``), or exact."""
    token = _CAP.set(on)
    try:
        yield
    finally:
        _CAP.reset(token)


def budgeted(max_examples: Optional[int]) -> bool:
    """Whether a row searched with ``max_examples`` runs within its pass budget."""
    return max_examples is None or _CAP.get()


def parameter_count(model: Any) -> int:
    """The model's parameters (shared ones once: ``nn.Module.parameters`` deduplicates tied weights)."""
    params = getattr(model, "parameters", None)
    return sum(p.numel() for p in params()) if callable(params) else 0


def attention_bytes(cfg: Any, tokens: int) -> int:
    """What the float32 attention patterns of one pass over ``tokens`` tokens cost, in weight bytes:
    ``n_layers * n_heads * tokens^2 * 4`` bytes, each priced :data:`PATTERN_BYTE_COST`."""
    return int(cfg.n_layers) * int(cfg.n_heads) * int(tokens) ** 2 * 4 * PATTERN_BYTE_COST


@dataclass
class Budget:
    """One row's budget: its passes so far (``cost``, live) weighed by what a pass of this model reads."""

    model_bytes: int  # per pass of the model
    twin_bytes: int  # per pass of a golden copy
    planned: int  # the examples the search would run without a budget
    limit: int = ROW_BUDGET
    cost: Cost = field(default_factory=Cost)  # the row's passes: counting()'s, set by the caller
    examples: int = 0  # examples measured by the budgeted search
    skipped: int = 0  # examples it drew after the budget was spent, not measured

    @classmethod
    def of(cls, model: Any, planned: int, tokens: int = 0) -> Optional[Budget]:
        """The budget of a row on ``model`` whose inputs are at most ``tokens`` long (0: the short default ones);
        None when ``planned`` examples fit it whatever they cost (small models, short inputs)."""
        params = parameter_count(model)
        patterns = attention_bytes(model.cfg, tokens)
        made = cls(params * max(4, model_dtype(model).itemsize) + patterns, params * TWIN_BYTES + 2 * patterns,
                   planned, ROW_BUDGET)
        return None if planned * MAX_PASSES * (made.model_bytes + made.twin_bytes) <= made.limit else made

    def spent(self) -> float:
        """Bytes of weights read so far."""
        return self.cost.model_passes * self.model_bytes + self.cost.twin_passes * self.twin_bytes

    def examples_for(self, first: float) -> int:
        """The examples to search, from what the first (the simplest input) cost: as many as the budget pays for."""
        return max(MIN_EXAMPLES, min(self.planned, int(self.limit // max(first, 1.0))))

    def exhausted(self) -> bool:
        """Whether the next drawn example is skipped: at least MIN_EXAMPLES ran and the budget is spent."""
        return self.examples >= MIN_EXAMPLES and self.spent() >= self.limit

    def text(self) -> str:
        """The row's note when the budget cut its search ("" when it did not)."""
        if self.examples >= self.planned and not self.skipped:
            return ""
        return (f"budget: {self.examples} of {self.planned} examples ({self.spent() / 1e9:.1f} GB of weights and "
                f"patterns read, {self.model_bytes / 1e9:.2g} GB a pass; max_examples={self.planned} runs them all)")
