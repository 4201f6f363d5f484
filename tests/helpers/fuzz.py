"""Shared by the reliability tests: the clean-error contracts, a tally of fuzz cases, directory snapshots.

The contracts (docs/architecture.md, "Errors"): a bad value given to the API raises ValueError or
TypeError (OSError subclasses for paths) whose message names the value; given to the CLI it
ends as exactly one line on stderr, ``attnlab: ...``, exit code 2, no traceback. Either way
nothing is written. Every generated case goes through :func:`api_error` or :func:`cli_error`,
which count it; the counts are printed at the end of the session ("attnlab fuzz: ...").
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st

NAN, INF = math.nan, math.inf
TALLY: Counter = Counter()  # "<kind> tried" / "<kind> clean" for kind in api, cli, file, kill
API_ERRORS = (ValueError, TypeError)


def fuzz_settings(n: int) -> settings:
    """``n`` examples (the ``ci`` budget these tests are sized for), or the profile's own if larger
    (``thorough`` runs 500 per test)."""
    return settings(max_examples=max(n, settings.default.max_examples))


def value_forms(value: Any) -> list[str]:
    """Ways a message may spell ``value``: its repr, its str, and as a number after parsing."""
    forms = [repr(value), str(value)]
    if isinstance(value, str):
        # the CLI strips a key=value key: " \ud7fc=1" is named as its repr without the space, ['\ud7fc']
        forms += [" ".join(value.split()), repr(value)[1:-1], repr(" ".join(value.split()))[1:-1]]
        try:
            number = float(value)
        except ValueError:
            number = None
        if number is not None:
            forms += [repr(number), str(number)]
            if math.isfinite(number) and number == int(number):
                forms.append(str(int(number)))
    return [f for f in forms if f]


def _check_names(message: str, names: tuple[str, ...], value: Any) -> None:
    if names:
        assert any(n in message for n in names), f"none of {names} named in: {message}"
    if value is not _NO_VALUE:
        forms = value_forms(value)
        assert any(f in message for f in forms), f"value {value!r} not named in: {message}"


_NO_VALUE = object()


def api_error(call: Callable[[], Any], *names: str, value: Any = _NO_VALUE,
              errors: tuple[type[BaseException], ...] = API_ERRORS) -> BaseException:
    """``call()`` must raise one of ``errors`` whose message holds one of ``names`` and spells ``value``."""
    TALLY["api tried"] += 1
    with pytest.raises(errors) as info:
        call()
    _check_names(str(info.value), names, value)
    TALLY["api clean"] += 1
    return info.value


def one_line_error(result: Any, code: int = 2) -> str:
    """The CLI contract on a click ``Result`` (or anything with exit_code/stdout/stderr)."""
    err = result.stderr.strip()
    assert result.exit_code == code, (result.exit_code, result.stdout, err)
    assert err.startswith("attnlab: "), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert not re.search(r"\bnan\b", result.stdout, re.I), result.stdout  # no half-made output on the way out
    return err


def cli_error(result: Any, *names: str, value: Any = _NO_VALUE, code: int = 2) -> str:
    """Count one CLI case and check it: one line, exit ``code``, naming ``names``/``value``."""
    TALLY["cli tried"] += 1
    err = one_line_error(result, code)
    _check_names(err, names, value)
    TALLY["cli clean"] += 1
    return err


def count_file_case(refused: bool) -> None:
    """A damaged-file case: refused with a clean error (True), or loaded because it was still valid."""
    TALLY["file tried"] += 1
    TALLY["file clean" if refused else "file loaded"] += 1


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with a hash of its bytes ({} when ``root`` does not exist)."""
    root = Path(root)
    if not root.exists():
        return {}
    out = {}
    for dirpath, _dirs, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out[rel + "/"] = ""
        for name in filenames:
            path = Path(dirpath, name)
            out[os.path.join(rel, name)] = hashlib.sha1(path.read_bytes()).hexdigest()
    return out


class _Summary:
    """Registered once per session: prints the tally under pytest's summary."""

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not TALLY:
            return
        parts = []
        for kind in ("api", "cli"):
            if TALLY[f"{kind} tried"]:
                parts.append(f"{kind} {TALLY[f'{kind} clean']}/{TALLY[f'{kind} tried']} clean errors")
        if TALLY["file tried"]:
            parts.append(f"damaged or untrusted files: {TALLY['file clean']} of {TALLY['file tried']} refused with an "
                         f"error naming the file, {TALLY['file loaded']} still valid after a random header flip")
        total = sum(TALLY[f"{k} tried"] for k in ("api", "cli"))
        clean = sum(TALLY[f"{k} clean"] for k in ("api", "cli"))
        head = f"{clean}/{total} generated bad-input cases gave a clean error; " if total else ""
        if TALLY["kill tried"]:
            parts.append(f"SIGKILL trials {TALLY['kill clean']}/{TALLY['kill tried']} resumed exactly "
                         f"({TALLY['kill killed']} killed mid-run, {TALLY['kill mid-swap']} of them between the "
                         f"two renames of a checkpoint swap; {TALLY['kill finished first']} finished first)")
        terminalreporter.write_line(f"attnlab fuzz: {head}{'; '.join(parts)}")


def install_summary(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("attnlab-fuzz-summary"):
        config.pluginmanager.register(_Summary(), "attnlab-fuzz-summary")


# --- invalid values, by kind: strategies the fuzz tests draw from ------------------------------------
OTHER = st.one_of(st.text(max_size=6), st.none(), st.just([1]), st.just({"a": 1}), st.just((2,)), st.just(b"1"))


def not_int(none_ok: bool = False):
    """Anything but an int (bools are refused too: True is not a layer count)."""
    kinds = [st.floats(allow_nan=True, allow_infinity=True), st.booleans(), OTHER]
    return st.one_of(*kinds).filter(lambda v: not (none_ok and v is None))


def bad_int(minimum: int, none_ok: bool = False):
    return st.one_of(st.integers(max_value=minimum - 1), not_int(none_ok))


def not_number():
    return st.one_of(st.booleans(), OTHER)


def bad_float(low: float, high: float | None = None, low_inclusive: bool = False, none_ok: bool = False):
    """Numbers outside (low, high] (or [low, high]), NaN, +-inf, and non-numbers."""
    below = st.floats(max_value=low, exclude_max=low_inclusive, allow_nan=False)
    others = not_number().filter(lambda v: not (none_ok and v is None))
    kinds = [below, st.just(NAN), st.just(INF), st.just(-INF), others]
    if high is not None:
        kinds.append(st.floats(min_value=high, exclude_min=True, allow_nan=False))
    return st.one_of(*kinds)


def bad_choice(choices, none_ok: bool = False):
    texts = st.text(max_size=10).filter(lambda s: s not in choices)
    return st.one_of(texts, st.integers(), st.booleans(), OTHER).filter(
        lambda v: not (none_ok and v is None) and not (isinstance(v, str) and v in choices))


def not_bool():
    return st.one_of(st.integers(), st.floats(allow_nan=False), OTHER)


