"""nox sessions. They run in the current environment (install with `pip install -e '.[test]'`
after the CPU torch wheel), so a session costs test time, not install time.

    nox                 lint, typecheck, tests, slow, properties, bench (short), browser  -- what CI runs
    nox -s tests        the fast tier (~7 minutes on 2 cores): unit, reference-equivalence, mutation,
                        CLI, resource and untrusted-file tests, and the fuzz at the ci profile's budget
    nox -s slow         the slow tier (tests marked slow): DDP, SIGINT/SIGKILL trials, learning runs, the
                        census on a local Ray instance (Ray is in the test extra; the test skips without it),
                        then the full fuzz (the fuzz modules at the thorough profile)
    nox -s properties   hypothesis property tests over many generated configurations
    nox -s bench        side-by-side benchmarks, short mode (ATTNLAB_BENCH=full for the full table)
    nox -s lint         ruff and the import-layer contracts (lint-imports)
    nox -s typecheck    mypy over harness, properties, probes, reports
    nox -s report       smoke run of `attnlab demo` on a tiny configuration
    nox -s browser      renders a report in headless Chromium and checks the screenshot
    nox -s census       the census of every transformers model type (reports/census), 2 workers
    nox -s census_variants  21 drawn configs of each of 48 common model types (3 of them at three dtypes)
"""

import os
import sys

import nox

PY = sys.executable  # the interpreter nox runs under: the project venv, activated or not

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "typecheck", "tests", "slow", "properties", "bench", "browser"]
# The fuzz modules: the fast tier runs them at the ci profile, the slow tier again at the thorough one.
FUZZ = ["tests/test_fuzz_api.py", "tests/test_fuzz_cli.py", "tests/test_fuzz_model.py", "tests/test_untrusted_files.py"]


@nox.session
def tests(session: nox.Session) -> None:
    # two pytest-xdist workers: one per core of the 2-core machines CI runs on (benchmarks never run here)
    session.run(PY, "-m", "pytest", "tests", "-m", "not bench and not properties and not slow", "-q", "-n", "2",
                "--ignore=tests/test_browser.py", *session.posargs,
                env={"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")})


@nox.session
def slow(session: nox.Session) -> None:
    # --maxschedchunk=1: the tests marked long (minutes each) are collected first and handed out one at a time as
    # the workers free up (tests/conftest.py), not in runs of consecutive tests that leave one worker the tail
    session.run(PY, "-m", "pytest", "tests", "-m", "slow and not bench and not properties", "-q", "-n", "2",
                "--maxschedchunk=1", "--ignore=tests/test_browser.py", "--durations=25", *session.posargs,
                env={"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")})
    # the full fuzz: 500 examples per search where the fast tier's ci profile runs 25
    session.run(PY, "-m", "pytest", *FUZZ, "-m", "not slow", "-q", "-n", "2", *session.posargs,
                env={"HYPOTHESIS_PROFILE": "thorough"})


@nox.session
def properties(session: nox.Session) -> None:
    session.run(PY, "-m", "pytest", "tests", "-m", "properties", "-q", "-n", "2", *session.posargs,
                env={"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")})


@nox.session
def bench(session: nox.Session) -> None:
    # addopts without --jaxtyping-packages: the tests check shapes at run time, which a user's run never pays
    # (check_model on Gemma-3-270M in bfloat16: 66.0 s with the checks, 58.9 s without, load ~1.3)
    session.run(PY, "-m", "pytest", "tests/bench", "-m", "bench", "-q", "-p", "no:randomly", "-o",
                "addopts=-ra --strict-markers",
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
def census(session: nox.Session) -> None:
    # every model type transformers ships, tiny, over 2 workers (a few minutes; cached by transformers version and
    # code hash in $ATTNLAB_CACHE); CSV in census.csv. `attnlab census --write-docs` regenerates docs/models.md.
    session.run(PY, "-m", "reports.census", "--workers", "2", "--out", "census.csv", *session.posargs)


@nox.session
def census_variants(session: nox.Session) -> None:
    # configuration variants (reports/census/variants.py): 21 drawn configs of each of the 40 most used decoders and
    # the 8 encoder-decoders (1,008 configs) at float32, the first 3 of each also at bfloat16 and float16, 2 workers
    # (~40 min on 2 shared cores: run it niced, in the background); rewrites the variants section of docs/models.md
    # and docs/census_variants.json
    session.run(PY, "-m", "reports.census", "--variants", "21", "--seed", "0", "--dtype", "float32", "--dtype",
                "bfloat16", "--dtype", "float16", "--dtype-variants", "3", "--workers", "2", "--write-docs",
                *session.posargs)


@nox.session
def browser(session: nox.Session) -> None:
    session.run(PY, "-m", "pytest", "tests/test_browser.py", "-q", "-rs", *session.posargs)
