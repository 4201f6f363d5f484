"""The property checks, one module per idea; each public function returns a :class:`PropertyResult`."""

from properties.checks.alibi import alibi_slopes
from properties.checks.batch import batch_independence
from properties.checks.causal import causal_outputs, causal_pattern
from properties.checks.components import rotary_formula, sinusoidal_formula
from properties.checks.finite import finite_outputs
from properties.checks.kernel import kernel_consistency
from properties.checks.kv_cache import kv_cache
from properties.checks.padding import padding_outputs, padding_pattern
from properties.checks.pattern import pattern_distribution
from properties.checks.permutation import permutation_equivariance
from properties.checks.relative import relative_position, rotary_norm, sinusoidal_shift
from properties.checks.rotary_precision import rotary_precision
from properties.checks.scale import attention_scale
from properties.checks.sliding_window import sliding_window

__all__ = [
    "attention_scale", "batch_independence", "causal_outputs", "causal_pattern", "kv_cache",
    "padding_outputs", "padding_pattern", "pattern_distribution", "permutation_equivariance",
    "relative_position", "rotary_formula", "rotary_norm", "sinusoidal_formula", "sinusoidal_shift",
    "sliding_window", "alibi_slopes", "finite_outputs", "kernel_consistency", "rotary_precision",
]
