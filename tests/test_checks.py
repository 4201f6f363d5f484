"""harness._checks: the one set of argument validators (what each accepts, and its one message form)."""

from __future__ import annotations

import math

import pytest

from harness._checks import (
    MAX_SEED,
    check_bool,
    check_choice,
    check_int,
    check_ints,
    check_number,
    check_positive_int,
    check_seed,
    check_sequence,
    is_finite,
)


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, [1]])
def test_an_int_is_never_a_bool_a_float_or_a_string(value):
    with pytest.raises(ValueError, match=r"^n=.* is invalid: expected an integer >= 1$"):
        check_positive_int("n", value)


def test_int_bounds_and_their_wording():
    assert check_int("k", 3, 0, 3) == 3 and check_int("k", None, 1, none_ok=True) is None
    for value, kw, wording in [(4, dict(minimum=0, maximum=3), "an integer in [0, 3]"),
                               (-1, dict(minimum=0), "an integer >= 0"),
                               (0, dict(minimum=1, none_ok=True), "None or an integer >= 1"),
                               (9, dict(maximum=8), "an integer <= 8")]:
        with pytest.raises(ValueError) as info:
            check_int("k", value, **kw)
        assert str(info.value) == f"k={value!r} is invalid: expected {wording}"
    with pytest.raises(ValueError, match=r"^task 'copy': option n=0 is invalid: expected at least 1$"):
        check_int("task 'copy': option n", 0, 1, expected="at least 1")


def test_numbers_are_finite_unless_told_otherwise():
    assert check_number("lr", 1e-3, 0.0) == 1e-3
    for bad in (math.inf, math.nan, 10**400, -1.0):
        with pytest.raises(ValueError, match=r"expected a finite number > 0\.0$"):
            check_number("lr", bad, 0.0)
    with pytest.raises(ValueError, match=r"^lr=True is invalid: expected a number$"):
        check_number("lr", True, 0.0)
    assert check_number("t", math.inf, 0, low_inclusive=True, finite=False) == math.inf
    with pytest.raises(ValueError):  # NaN is out of every range, finite or not
        check_number("t", math.nan, finite=False)
    with pytest.raises(ValueError, match=r"expected a finite number >= 0\.0 and < 1\.0$"):
        check_number("m", 1.0, 0.0, 1.0, low_inclusive=True, high_inclusive=False)
    assert not is_finite(True) and not is_finite(10**400) and is_finite(2)


def test_bool_choice_seed_and_int_sequences():
    assert check_bool("flag", False) is False
    with pytest.raises(ValueError, match=r"^flag=1 is invalid: expected True or False$"):
        check_bool("flag", 1)
    assert check_choice("norm", None, ("LN", None)) is None
    for bad in (True, ["LN"], "ln"):  # True == 1 would pass a plain `in` test against (1, 2)
        with pytest.raises(ValueError, match=r"expected one of \['LN', None\]$"):
            check_choice("norm", bad, ("LN", None))
    with pytest.raises(ValueError):
        check_choice("k", True, (1, 2))
    assert check_seed("seed", MAX_SEED) == MAX_SEED
    with pytest.raises(ValueError, match=r"expected an integer in \[0, 9223372036854775807\] \(2\*\*63 - 1\)$"):
        check_seed("seed", MAX_SEED + 1)
    assert check_ints("seeds", iter([0, 2]), 0) == (0, 2)
    for bad in ("01", (), (0, -1), (0, True), 3):
        with pytest.raises(ValueError, match=r"expected a non-empty sequence of integers >= 0$"):
            check_ints("seeds", bad, 0)


def test_a_sequence_is_any_non_empty_iterable_but_a_string():
    assert check_sequence("budgets", (x / 10 for x in (1, 2)), "numbers") == (0.1, 0.2)
    assert check_sequence("budgets", [0.5], "numbers") == (0.5,)
    for bad, shown in (("0.1", "'0.1'"), (b"1", "b'1'"), ([], r"\(\)"), (iter(()), r"\(\)"), (0.1, "0.1")):
        with pytest.raises(ValueError, match=rf"^budgets={shown} is invalid: expected numbers$"):
            check_sequence("budgets", bad, "numbers")
