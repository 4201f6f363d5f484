"""Where the census's jobs run: one interface, two implementations.

A job is one model type (reports/census/run.py) or one drawn config (reports/census/variants_run.py): a picklable
function of one item that returns the item's row as JSON, run in a worker process set up by :func:`init_worker` (one
torch thread; the alarm inside the job turns an overrun into a timed-out row, the same on either executor).

- :class:`LocalPool`, the default: fork worker processes on this machine. A worker that dies breaks the pool; the
  unfinished items then go one at a time, so the item that kills a lone worker is known and becomes its row.
- :class:`RayCluster` (``pip install 'attnlab[ray]'``): one Ray task per item, asking for one CPU and
  :data:`MEMORY` bytes, never retried, on a local Ray instance or a running cluster. A task whose worker dies is its
  row; a task still running :data:`GRACE_S` past its item's budget (what the alarm could not stop: a hang in native
  code) is cancelled and becomes a timed-out row.

Either way each item gets exactly one row, and rows come back in the order they finish. The executor never decides
a result: the same item gives the same row on both.
"""

from __future__ import annotations

import abc
import concurrent.futures as cf
import importlib
import logging
import multiprocessing
import signal
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional, TypeVar

import torch

from harness.errors import AttnlabError

T = TypeVar("T")
RowJSON = dict[str, Any]

KINDS = ("local", "ray")
DIED = "the worker process died (killed for memory or crashed in native code) on it"
OOM = "Ray's memory monitor killed the worker process (its node ran out of memory) on it"
MEMORY = 2**30  # Ray's memory request per task: a census worker peaks near 0.5 GB (torch, transformers, a tiny model)
GRACE_S = 15.0  # Ray's deadline is the item's budget plus this: the alarm inside the task, which names the stage, wins
CONNECT_S = 5.0  # how long --address gets to answer
# How a local Ray instance is started. Ray runs its workers at niceness 15 by default, below everything else on the
# machine; a census task's budget is wall-clock time, so on a busy machine starved workers would turn into timed-out
# rows that the local pool (whose forked workers keep this process's niceness) does not produce. The local instance
# runs its workers at this process's niceness instead, so the two executors see the same machine. (A cluster at
# --address keeps the settings whoever started it chose.)
RAY_INIT: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
LOCAL_RAY: dict[str, Any] = {**RAY_INIT, "_system_config": {"worker_niceness": 0}}


class TimedOut(BaseException):
    """Raised in a worker by its alarm: a BaseException, so no ``except Exception`` of a stage swallows it."""


def _alarm(signum: int, frame: Any) -> None:
    raise TimedOut()


def init_worker() -> None:
    """Set up a census worker process: one torch thread (one summation order, and N workers share N cores) and the
    alarm handler the jobs' timeouts raise through."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _alarm)


class Executor(abc.ABC):
    """Runs jobs in worker processes: ``map`` gives each item of ``todo`` its row, in the order they finish."""

    kind: str

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the executor started."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the jobs ran, for the run's summary line ("2 worker(s)", "Ray (8 CPUs at HOST:PORT)")."""

    @abc.abstractmethod
    def map(self, work: Callable[[T], RowJSON], todo: Sequence[T], lost: Callable[[T, str], RowJSON],
            budget_s: Callable[[T], float]) -> Iterator[tuple[T, RowJSON]]:
        """``(item, work(item))`` for each item as it finishes, run in a worker process; ``(item, lost(item, why))``
        where its worker died or (Ray) it overran ``budget_s(item)`` seconds and was cancelled."""


def open_executor(kind: str = "local", *, workers: int = 1, address: Optional[str] = None,
                  fingerprint: Optional[Callable[[], str]] = None) -> Executor:
    """The executor ``--executor kind`` names, its arguments checked (and Ray connected) before any model is built;
    a context manager that releases it."""
    if kind not in KINDS:
        raise AttnlabError(f"--executor {kind!r} is invalid: expected one of {', '.join(KINDS)}")
    if kind == "local":
        if address is not None:
            raise AttnlabError(f"--address {address} names a Ray cluster: add --executor ray (or drop --address)")
        return LocalPool(workers)
    import_ray()
    if workers != 1:
        raise AttnlabError(f"--workers {workers} sizes the local pool; Ray runs one task on each free CPU of its "
                           f"cluster: drop --workers")
    return RayCluster(address, fingerprint)


class LocalPool(Executor):
    """``workers`` fork processes on this machine; the jobs' alarm is their timeout (``budget_s`` is unused: a pool
    cannot stop one of its processes)."""

    kind = "local"

    def __init__(self, workers: int = 1):
        self.workers = workers

    def close(self) -> None:
        """Nothing to release: each ``map`` call's pool is gone when it returns."""

    def describe(self) -> str:
        return f"{self.workers} worker(s)"

    def map(self, work: Callable[[T], RowJSON], todo: Sequence[T], lost: Callable[[T, str], RowJSON],
            budget_s: Callable[[T], float]) -> Iterator[tuple[T, RowJSON]]:
        workers, left = self.workers, list(todo)
        while left:
            finished: set[int] = set()
            yield from _pool(work, left, workers, finished)
            left = [item for i, item in enumerate(left) if i not in finished]
            if left and workers == 1:  # one worker runs in order: the first unfinished item is the one that killed it
                yield left[0], lost(left[0], DIED)
                left = left[1:]
            workers = 1 if left else workers  # which of N killed its worker is unknown: the rest go one at a time


def _pool(work: Callable[[T], RowJSON], todo: list[T], workers: int,
          finished: set[int]) -> Iterator[tuple[T, RowJSON]]:
    """Run ``todo`` on a fresh pool, in order, adding each finished index to ``finished``; stop when a worker died."""
    context = multiprocessing.get_context("fork")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=init_worker) as pool:
        futures = [pool.submit(work, item) for item in todo]
        for i, future in enumerate(futures):
            try:
                row = future.result()
            except cf.process.BrokenProcessPool:
                return
            finished.add(i)
            yield todo[i], row


_STARTED = "started"  # a Ray task's first output: from then on its deadline runs (a queued task has none)


def _task(work: Callable[[T], RowJSON], item: T) -> Iterator[Any]:
    """One item as a Ray task (a streaming generator): the start marker, then the row."""
    init_worker()
    yield _STARTED
    yield work(item)


def _call(fn: Callable[[], Any]) -> Any:
    return fn()


def import_ray() -> Any:
    """The ``ray`` module, or the error saying how to install it. Imported on use: an optional extra that the local
    pool neither needs nor pays for (its import takes a second)."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise AttnlabError("--executor ray needs Ray: pip install 'attnlab[ray]'") from None


def check_answers(address: str, timeout_s: float = CONNECT_S) -> None:
    """Refuse ``address`` (HOST:PORT or auto) unless something listens there: ray.init itself would retry a dead
    address for minutes. A Ray Client address (ray://) is refused too: Ray Client has no streaming generators, which
    tell the driver when a task starts."""
    if address == "auto":
        return  # Ray looks up the cluster `ray start` started on this machine, and says so when there is none
    if address.startswith("ray://"):
        raise AttnlabError(f"--address {address}: Ray Client addresses are not supported (the census's tasks stream "
                           f"their start, which Ray Client cannot); run the census on a node of the cluster with "
                           f"--address HOST:PORT, as `ray start --head` prints it, or auto")
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise AttnlabError(f"--address {address!r} is invalid: expected HOST:PORT (as `ray start --head` prints it) "
                           f"or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise AttnlabError(f"--address {address}: no Ray cluster answers there within {timeout_s:.0f} s "
                           f"({exc.strerror or exc}); start one with `ray start --head` (it prints the address to "
                           f"pass) or omit --address to start a local one") from None


class RayCluster(Executor):
    """Jobs as Ray tasks: on the cluster at ``address``, or (None) a local Ray instance started here and stopped at
    :meth:`close`, or the connection this process already has (``ray.init`` called before).

    ``fingerprint`` (a function of no arguments) is run once on a worker and must return what it returns here: the
    census's cache key, so a cluster running other attnlab code or another transformers is refused before any model
    is built, rather than filling this machine's cache with its results."""

    kind = "ray"

    def __init__(self, address: Optional[str] = None, fingerprint: Optional[Callable[[], str]] = None,
                 grace_s: float = GRACE_S):
        self._ray = ray = import_ray()
        self.address, self.grace_s, self._started = address, grace_s, False
        if address is not None:
            check_answers(address)
        if ray.is_initialized():
            if address is not None:
                raise AttnlabError(f"--address {address}: this process is already connected to Ray")
        else:
            self._connect(address)
        try:
            self._check_fits()
            if fingerprint is not None:
                self._check_code(fingerprint)
        except BaseException:
            self.close()
            raise

    def _connect(self, address: Optional[str]) -> None:
        where = f"--address {address}" if address is not None else "a local Ray instance"
        try:
            # "local": a fresh instance on this machine, never one found through RAY_ADDRESS or a stale record
            self._ray.init(address=address or "local", **(LOCAL_RAY if address is None else RAY_INIT))
        except Exception as exc:  # the address is the user's: any refusal of it is bad input, in one line
            raise AttnlabError(f"{where}: Ray could not connect ({type(exc).__name__}: {exc}); start a cluster with "
                               f"`ray start --head` or omit --address to start a local one") from None
        self._started = True

    def _check_fits(self) -> None:
        """A task that no node can hold would wait for ever: refuse such a cluster now."""
        nodes = [n["Resources"] for n in self._ray.nodes() if n.get("Alive")]
        if not any(r.get("CPU", 0) >= 1 and r.get("memory", 0) >= MEMORY for r in nodes):
            raise AttnlabError(f"the Ray cluster{self._at()} has no node with 1 CPU and {MEMORY / 2**30:.0f} GiB of "
                               f"memory for a census task (its nodes: {nodes})")

    def _check_code(self, fingerprint: Callable[[], str]) -> None:
        ray = self._ray
        ref = ray.remote(_call).options(num_cpus=0, max_retries=0).remote(fingerprint)
        try:
            theirs = ray.get(ref, timeout=120)
        except ray.exceptions.GetTimeoutError:
            raise AttnlabError(f"the Ray cluster{self._at()} ran no task within 120 s") from None
        ours = fingerprint()
        if theirs != ours:
            raise AttnlabError(f"the Ray cluster{self._at()} runs other census code: its workers' cache key is "
                               f"{theirs}, this machine's {ours} (install the same attnlab and transformers there)")

    def _at(self) -> str:
        return f" at {self.address}" if self.address is not None else ""

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False

    def describe(self) -> str:
        cpus = int(self._ray.cluster_resources().get("CPU", 0))
        return f"Ray ({cpus} CPUs{self._at() or ', local'})"

    def map(self, work: Callable[[T], RowJSON], todo: Sequence[T], lost: Callable[[T, str], RowJSON],
            budget_s: Callable[[T], float]) -> Iterator[tuple[T, RowJSON]]:
        ray = self._ray
        task = ray.remote(_task).options(num_cpus=1, memory=MEMORY, max_retries=0, num_returns="streaming")
        waiting: dict[Any, T] = {task.remote(work, item): item for item in todo}
        deadline: dict[Any, float] = {}  # the started tasks: when Ray gives up on each
        died = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OutOfMemoryError)
        try:
            while waiting:
                wait = max(0.0, min(deadline.values()) - time.monotonic()) if deadline else None
                ready, _ = ray.wait(list(waiting), num_returns=1, timeout=wait)
                for gen in ready:
                    try:
                        value = ray.get(next(gen))
                    except died as exc:
                        item = waiting.pop(gen)
                        deadline.pop(gen, None)
                        oom = isinstance(exc, ray.exceptions.OutOfMemoryError)
                        yield item, lost(item, OOM if oom else DIED)
                        continue
                    if value == _STARTED:
                        deadline[gen] = time.monotonic() + budget_s(waiting[gen]) + self.grace_s
                    else:
                        deadline.pop(gen, None)
                        yield waiting.pop(gen), value
                now = time.monotonic()
                for gen in [g for g, t in deadline.items() if t <= now]:
                    ray.cancel(gen, force=True)
                    item = waiting.pop(gen)
                    del deadline[gen]
                    yield item, lost(item, f"timed out: still running {budget_s(item) + self.grace_s:.0f} s after "
                                           f"it started (its budget plus {self.grace_s:.0f} s), so Ray cancelled it")
        finally:
            for gen in waiting:  # stopped early (an error, Ctrl-C): leave nothing running on the cluster
                ray.cancel(gen, force=True)
