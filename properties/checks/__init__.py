"""The property checks, one module per idea; each public function returns a :class:`PropertyResult`."""

from properties.checks.batch import batch_independence
from properties.checks.causal import causal_outputs, causal_pattern
from properties.checks.components import rotary_formula, sinusoidal_formula
from properties.checks.kv_cache import kv_cache
from properties.checks.padding import padding_outputs, padding_pattern
from properties.checks.pattern import pattern_distribution
from properties.checks.permutation import permutation_equivariance
from properties.checks.relative import relative_position, rotary_norm, sinusoidal_shift
from properties.checks.scale import attention_scale

__all__ = [
    "attention_scale", "batch_independence", "causal_outputs", "causal_pattern", "kv_cache",
    "padding_outputs", "padding_pattern", "pattern_distribution", "permutation_equivariance",
    "relative_position", "rotary_formula", "rotary_norm", "sinusoidal_formula", "sinusoidal_shift",
]
