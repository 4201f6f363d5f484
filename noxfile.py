"""nox sessions. They run in the current environment (install with `pip install -e '.[test]'`
after the CPU torch wheel), so a session costs test time, not install time.

    nox                 lint, tests, properties, bench (short), browser  -- what CI runs
    nox -s tests        unit, reference-equivalence, mutation and CLI tests
    nox -s properties   hypothesis property tests over many generated configurations
    nox -s bench        side-by-side benchmarks, short mode (ATTNLAB_BENCH=full for the full table)
    nox -s lint         ruff and the import-layer contracts (lint-imports)
    nox -s typecheck    mypy over harness, properties, probes, reports
    nox -s report       smoke run of `attnlab demo` on a tiny configuration
    nox -s browser      renders a report in headless Chromium and checks the screenshot
"""

import os
import sys

import nox

PY = sys.executable  # the interpreter nox runs under: the project venv, activated or not

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "typecheck", "tests", "properties", "bench", "browser"]


@nox.session
def tests(session: nox.Session) -> None:
    session.run(PY, "-m", "pytest", "tests", "-m", "not bench and not properties", "-q",
                "--ignore=tests/test_browser.py", *session.posargs,
                env={"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")})


@nox.session
def properties(session: nox.Session) -> None:
    session.run(PY, "-m", "pytest", "tests", "-m", "properties", "-q", *session.posargs,
                env={"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")})


@nox.session
def bench(session: nox.Session) -> None:
    session.run(PY, "-m", "pytest", "tests/bench", "-m", "bench", "-q", "-p", "no:randomly",
                "--benchmark-columns=min,median,rounds", "--benchmark-sort=name", *session.posargs,
                env={"ATTNLAB_BENCH": os.environ.get("ATTNLAB_BENCH", "short")})


@nox.session
def lint(session: nox.Session) -> None:
    session.run(PY, "-m", "ruff", "check", "harness", "probes", "properties", "reports", "tests", "noxfile.py")
    # the layering (pyproject [tool.importlinter]): reports > properties | probes > harness
    session.run(os.path.join(os.path.dirname(PY), "lint-imports"), external=True)


@nox.session
def typecheck(session: nox.Session) -> None:
    # mypy over the four packages; its settings are in pyproject [tool.mypy]
    session.run(PY, "-m", "mypy", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    session.run(PY, "-m", "pytest", "tests", "-m", "not bench and not properties", "-q", "-k", "report or cli",
                *session.posargs)


@nox.session
def browser(session: nox.Session) -> None:
    session.run(PY, "-m", "pytest", "tests/test_browser.py", "-q", "-rs", *session.posargs)
