"""The attention-kernel conformance suite: any callable with transformers' AttentionInterface signature,
judged row by row (one attention feature each) against a float64 eager reference, within an allowance
measured from the at-dtype eager formula's own rounding (docs/kernels.md).

    >>> from properties.kernels import check_kernel
    >>> check_kernel(my_kernel, dtypes=("float32", "bfloat16"))   # doctest: +SKIP
"""

from properties.kernels.builtins import builtins
from properties.kernels.capabilities import CONVENTIONS, Capabilities
from properties.kernels.case import Case
from properties.kernels.grid import NAMES
from properties.kernels.suite import COLUMNS, DEFAULT_EXAMPLES, check_kernel

__all__ = ["check_kernel", "builtins", "Capabilities", "Case", "CONVENTIONS", "NAMES", "COLUMNS", "DEFAULT_EXAMPLES"]
