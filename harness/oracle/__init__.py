"""The design oracle: what a Hugging Face config declares, computed from the config and the papers alone.

A check that compares a model with a value read back from the module under test proves only that the
model is self-consistent: a port that computes Gemma-2's scale from ``hidden_size / heads`` (llama.cpp
#8444) keeps every invariant and "matches" its own wrong ``scaling``. The oracle says what each number
must be from the config's documented meaning, written from the papers (Vaswani et al. 2017, Su et al.
2021, Peng et al. 2023, Ding et al. 2024, the Llama 3.1 release) and never by calling transformers'
own helpers (``rope_init_fns``, ``_compute_*_parameters``) or reading a module's attributes. Where
transformers' choice is a convention rather than a formula of a paper, the function cites the
documentation it follows.

Every answer is a :class:`Fact`: the value and the config fields it comes from, or, where the config
does not determine it for this model type, no value and the reason (a check is then n/a with it).

- :mod:`harness.oracle.scale`: the factor on q.k, per layer;
- :mod:`harness.oracle.rope`: per rotary layer, the inverse frequencies, the attention factor on
  cos/sin, the rotated span and the pair layout, at a given sequence length;
- :mod:`harness.oracle.windows`: per layer, its sliding window or none;
- :mod:`harness.oracle.context`: the first position and the usable context of a learned table.

Imports nothing of attnlab but ``harness.errors``: the adapters and the checks both read it, and it
reads neither.
"""

from harness.oracle.context import usable_context
from harness.oracle.fields import Fact
from harness.oracle.rope import RopeSpec, rotary
from harness.oracle.scale import scale
from harness.oracle.windows import window

__all__ = ["Fact", "RopeSpec", "rotary", "scale", "usable_context", "window"]
