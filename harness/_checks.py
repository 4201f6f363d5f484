"""The argument validators every package uses.

One spelling of each check, so that "an int" means the same thing everywhere: ``True`` is an
``int`` to Python but never a count, a seed or a size here. Every failure is one ``ValueError``
of the form ``{name}={value!r} is invalid: expected {expected}``, raised before any work.
``name`` may carry a context prefix (``"task 'copy': option n"``) and ``expected`` overrides the
default wording where a caller says more about what the value means.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Optional, TypeGuard

from harness.errors import AttnlabError

# torch.Generator.manual_seed takes at most 64 bits; 63 leaves room for derived seeds (seed + offset).
MAX_SEED = 2**63 - 1


def invalid(name: str, value: Any, expected: str) -> AttnlabError:
    """The one error message: ``{name}={value!r} is invalid: expected {expected}``."""
    return AttnlabError(f"{name}={value!r} is invalid: expected {expected}")


def is_int(value: Any) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    """A number that is neither NaN nor infinite (an int too large for a float is not finite either)."""
    try:
        return is_number(value) and math.isfinite(value)
    except OverflowError:
        return False


def _int_wording(minimum: Optional[int], maximum: Optional[int]) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an integer >= {minimum}"
    if maximum is not None:
        return f"an integer <= {maximum}"
    return "an integer"


def check_int(name: str, value: Any, minimum: Optional[int] = None, maximum: Optional[int] = None, *,
              none_ok: bool = False, expected: Optional[str] = None) -> Any:
    """``value`` is an integer (not a bool) in ``[minimum, maximum]``; ``None`` passes when ``none_ok``."""
    if none_ok and value is None:
        return None
    if not is_int(value) or (minimum is not None and value < minimum) \
            or (maximum is not None and value > maximum):
        if expected is None:
            expected = ("None or " if none_ok else "") + _int_wording(minimum, maximum)
        raise invalid(name, value, expected)
    return value


def check_positive_int(name: str, value: Any, *, none_ok: bool = False, expected: Optional[str] = None) -> Any:
    """``value`` is an integer >= 1 (a count or a size)."""
    return check_int(name, value, 1, none_ok=none_ok, expected=expected)


def check_sequence(name: str, values: Any, expected: str) -> tuple:
    """A non-empty sequence (any iterable but a string: a string is a sequence of characters, never of
    values here), as a tuple; its items are the caller's to check."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise invalid(name, values, expected)
    values = tuple(values)
    if not values:
        raise invalid(name, values, expected)
    return values


def check_ints(name: str, values: Any, minimum: int, *, expected: Optional[str] = None) -> tuple[int, ...]:
    """A non-empty sequence (any iterable but a string) of integers >= ``minimum``, as a tuple."""
    expected = expected or f"a non-empty sequence of integers >= {minimum}"
    values = check_sequence(name, values, expected)
    if not all(is_int(v) and v >= minimum for v in values):
        raise invalid(name, values, expected)
    return values


def check_number(name: str, value: Any, low: Optional[float] = None, high: Optional[float] = None, *,
                 low_inclusive: bool = False, high_inclusive: bool = True, finite: bool = True,
                 none_ok: bool = False, expected: Optional[str] = None) -> Any:
    """``value`` is a number (not a bool) within the bounds, and finite unless ``finite=False``.

    The default wording is "a number" for a value of the wrong type and "a finite number > low
    and <= high" for one out of range; ``expected`` replaces both. NaN fails every bound.
    """
    if none_ok and value is None:
        return None
    if not is_number(value):
        raise invalid(name, value, expected or "a number")
    ok_low = low is None or (value >= low if low_inclusive else value > low)
    ok_high = high is None or (value <= high if high_inclusive else value < high)
    # inf passes every lower bound but makes weights or updates non-finite; NaN fails every comparison
    if not (ok_low and ok_high and (is_finite(value) or not finite)) or (value != value):
        if expected is None:
            bounds = []
            if low is not None:
                bounds.append(f"{'>=' if low_inclusive else '>'} {low}")
            if high is not None:
                bounds.append(f"{'<=' if high_inclusive else '<'} {high}")
            expected = " ".join(["a finite number" if finite else "a number", " and ".join(bounds)]).strip()
        raise invalid(name, value, expected)
    return value


def check_bool(name: str, value: Any, *, none_ok: bool = False, expected: str = "True or False") -> Any:
    """``value`` is ``True`` or ``False`` (not 0/1, not a string)."""
    if none_ok and value is None:
        return None
    if not isinstance(value, bool):
        raise invalid(name, value, expected)
    return value


def check_choice(name: str, value: Any, choices: tuple, *, expected: Optional[str] = None) -> Any:
    """``value`` is one of ``choices`` (a bool never is: ``True == 1``)."""
    plain = isinstance(value, (str, int, float, type(None))) and not isinstance(value, bool)
    if not plain or value not in choices:
        raise invalid(name, value, expected or f"one of {list(choices)}")
    return value


def check_seed(name: str, value: Any) -> int:
    """A seed for ``torch.Generator.manual_seed``: an integer in ``[0, MAX_SEED]``."""
    check_int(name, value, 0)
    if value > MAX_SEED:
        raise invalid(name, value, f"an integer in [0, {MAX_SEED}] (2**63 - 1)")
    return value
