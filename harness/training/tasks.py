"""Training tasks: seeded batches of ``(tokens, loss_mask)`` and a masked accuracy.

Every task draws its batches from a ``torch.Generator`` passed in by the caller, so a
run's data order is part of its (checkpointed) RNG state and nothing here touches the
global RNG. ``tokens`` is ``[batch, pos]`` int64; ``loss_mask`` is ``[batch, pos]`` bool,
True where the token at that position is a prediction target: the model predicts
``tokens[:, t]`` from ``tokens[:, :t]``, so position 0 is never a target.

Tasks (``seq_len`` default in brackets):
    induction         [64] a random prefix repeated once; targets on the repeat
    copy / reverse / sort  [17] input, separator, the input copied / reversed / sorted
    modular_addition  [4]  ``a b = (a+b) mod p``; train and validation pairs disjoint
    markov            [64] a random sparse bigram chain; the model must learn its statistics
    text              [128] byte-level text (d_vocab 256), train/validation split by file
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Optional

import torch
from torch import Tensor

from harness._checks import check_bool, check_int, check_number, check_positive_int
from harness.errors import AttnlabError, AttnlabTypeError
from harness.training.text_corpus import load_corpus

SPLITS = ("train", "val")


def _opt(task: str, name: str) -> str:
    """How an option is named in its error: ``task 'copy': option n_symbols``."""
    return f"task {task!r}: option {name}"


class Task(ABC):
    """A source of ``(tokens, loss_mask)`` batches for one model vocabulary and context."""

    name: ClassVar[str]
    default_seq_len: ClassVar[int]
    options: ClassVar[dict[str, Any]]  # option name -> default

    def __init__(self, d_vocab: int, n_ctx: int, seq_len: Optional[int] = None,
                 options: Optional[dict] = None):
        check_options(self.name, options or {})
        self.d_vocab, self.n_ctx = d_vocab, n_ctx
        self.seq_len = self.default_seq_len if seq_len is None else seq_len
        check_int(f"task {self.name!r}: seq_len", self.seq_len, 2)
        if self.seq_len > n_ctx:
            raise AttnlabError(f"task {self.name!r}: seq_len={self.seq_len} is longer than the model's "
                               f"n_ctx={n_ctx}: expected seq_len <= {n_ctx}")
        self.opts = {**self.options, **(options or {})}

    def _need_vocab(self, needed: int, why: str) -> None:
        if self.d_vocab < needed:
            raise AttnlabError(f"task {self.name!r} needs d_vocab >= {needed} ({why}); the model has "
                               f"d_vocab={self.d_vocab}")

    def batch(self, batch_size: int, generator: torch.Generator, split: str = "train") -> tuple[Tensor, Tensor]:
        """``batch_size`` sequences: tokens ``[batch, pos]`` int64 and loss_mask ``[batch, pos]`` bool."""
        check_positive_int("batch_size", batch_size)
        if split not in SPLITS:
            raise AttnlabError(f"split={split!r} is invalid: expected one of {list(SPLITS)}")
        if not isinstance(generator, torch.Generator):
            raise AttnlabTypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        tokens, mask = self._batch(batch_size, generator, split)
        return tokens, mask

    @abstractmethod
    def _batch(self, batch_size: int, gen: torch.Generator, split: str) -> tuple[Tensor, Tensor]: ...


def _distinct(batch: int, n: int, vocab: int, gen: torch.Generator) -> Tensor:
    """``[batch, n]`` tokens, distinct within each row (the first n of a random permutation)."""
    return torch.rand(batch, vocab, generator=gen).argsort(dim=-1)[:, :n]


class Induction(Task):
    """A random prefix of n tokens, then the same n tokens again (Olsson et al. 2022).

    The prefix length n varies per sequence in ``[min_prefix, seq_len // 2]``, so no fixed
    positional offset predicts the repeat: only an induction mechanism (find the earlier
    occurrence of the current token, copy what followed it) does. Positions after the
    repeat are random filler and not targets. The first repeated token is not a target
    either: nothing before it signals that the repeat starts. Prefix tokens are distinct
    (``distinct=True``), so every target has exactly one earlier occurrence of its
    predecessor and accuracy can reach 1.
    """

    name = "induction"
    default_seq_len = 64
    options = {"min_prefix": None, "distinct": True}

    def __init__(self, d_vocab, n_ctx, seq_len=None, options=None):
        super().__init__(d_vocab, n_ctx, seq_len, options)
        self.max_prefix = self.seq_len // 2
        mp = self.opts["min_prefix"]
        self.min_prefix = max(2, self.seq_len // 4) if mp is None else check_int(_opt(self.name, "min_prefix"), mp, 2)
        if self.min_prefix > self.max_prefix:
            raise AttnlabError(f"task 'induction': option min_prefix={self.min_prefix} is invalid: expected "
                               f"at most seq_len // 2 = {self.max_prefix}")
        self.distinct = check_bool(_opt(self.name, "distinct"), self.opts["distinct"])
        self._need_vocab(self.max_prefix if self.distinct else 2,
                         f"a prefix of {self.max_prefix} distinct tokens" if self.distinct else "two symbols")

    def _batch(self, b, gen, split):
        T, n_max = self.seq_len, self.max_prefix
        if self.distinct:
            prefix = _distinct(b, n_max, self.d_vocab, gen)
        else:
            prefix = torch.randint(0, self.d_vocab, (b, n_max), generator=gen)
        n = torch.randint(self.min_prefix, n_max + 1, (b, 1), generator=gen)
        filler = torch.randint(0, self.d_vocab, (b, T), generator=gen)
        pos = torch.arange(T)[None]
        # position t < n holds prefix[t]; n <= t < 2n holds prefix[t - n]; the rest is filler
        src = torch.where(pos < n, pos, pos - n).clamp(max=n_max - 1)
        tokens = torch.where(pos < 2 * n, prefix.gather(1, src), filler)
        mask = (pos > n) & (pos < 2 * n)
        return tokens, mask


class _SeqToSeq(Task):
    """``x_1..x_n SEP y_1..y_n``: the answer y is a function of the input x."""

    default_seq_len = 17
    options = {"n_symbols": None}

    def __init__(self, d_vocab, n_ctx, seq_len=None, options=None):
        super().__init__(d_vocab, n_ctx, seq_len, options)
        if self.seq_len % 2 == 0 or self.seq_len < 3:
            raise AttnlabError(f"task {self.name!r}: seq_len={self.seq_len} is invalid: expected an odd number >= 3 "
                               "(input, one separator, an answer as long as the input)")
        self.n = (self.seq_len - 1) // 2
        self._need_vocab(3, "at least two symbols and a separator")
        ns = self.opts["n_symbols"]
        self.n_symbols = self.d_vocab - 1 if ns is None else check_int(_opt(self.name, "n_symbols"), ns, 2)
        if self.n_symbols > self.d_vocab - 1:
            raise AttnlabError(f"task {self.name!r}: option n_symbols={self.n_symbols} is invalid: expected at most "
                               f"d_vocab - 1 = {self.d_vocab - 1} (the last id is the separator)")
        self.sep = self.d_vocab - 1

    @abstractmethod
    def answer(self, x: Tensor) -> Tensor: ...

    def _batch(self, b, gen, split):
        x = torch.randint(0, self.n_symbols, (b, self.n), generator=gen)
        sep = torch.full((b, 1), self.sep, dtype=torch.long)
        tokens = torch.cat((x, sep, self.answer(x)), dim=1)
        mask = torch.zeros_like(tokens, dtype=torch.bool)
        mask[:, self.n + 1:] = True
        return tokens, mask


class Copy(_SeqToSeq):
    name = "copy"

    def answer(self, x):
        return x


class Reverse(_SeqToSeq):
    name = "reverse"

    def answer(self, x):
        return x.flip(1)


class Sort(_SeqToSeq):
    name = "sort"

    def answer(self, x):
        return x.sort(dim=1).values


class ModularAddition(Task):
    """``a b = c`` with c = (a + b) mod p (Power et al. 2022; p = 113 after Nanda et al. 2023).

    Ids 0..p-1 are the numbers and p is "="; only c is a target. The p^2 pairs are split once
    (by ``split_seed``) into a training fraction and a disjoint validation set, so
    validation accuracy measures generalization to unseen pairs.
    """

    name = "modular_addition"
    default_seq_len = 4
    options = {"p": 113, "train_fraction": 0.3, "split_seed": 0}

    def __init__(self, d_vocab, n_ctx, seq_len=None, options=None):
        super().__init__(d_vocab, n_ctx, seq_len, options)
        if self.seq_len != 4:
            raise AttnlabError(f"task 'modular_addition': seq_len={self.seq_len} is invalid: expected 4 (a b = c)")
        self.p = check_int(_opt(self.name, "p"), self.opts["p"], 2)
        self._need_vocab(self.p + 1, f"p={self.p} numbers and '='; pass a smaller task_options['p']")
        frac = float(check_number(_opt(self.name, "train_fraction"), self.opts["train_fraction"], 0.0, 1.0,
                                  high_inclusive=False, expected="a number in (0.0, 1.0)"))
        seed = check_int(_opt(self.name, "split_seed"), self.opts["split_seed"], 0)
        order = torch.randperm(self.p * self.p, generator=torch.Generator().manual_seed(seed))
        n_train = min(max(1, round(frac * self.p * self.p)), self.p * self.p - 1)
        self.pairs = {"train": order[:n_train], "val": order[n_train:]}

    def _batch(self, b, gen, split):
        pool = self.pairs[split]
        idx = pool[torch.randint(0, len(pool), (b,), generator=gen)]
        a, c = idx // self.p, idx % self.p
        tokens = torch.stack((a, c, torch.full_like(a, self.p), (a + c) % self.p), dim=1)
        mask = torch.zeros_like(tokens, dtype=torch.bool)
        mask[:, 3] = True
        return tokens, mask


class Markov(Task):
    """A random sparse bigram chain: each state moves to ``branching`` successors.

    The chain (successors and their probabilities, Dirichlet(1) via normalized exponentials)
    is fixed by ``chain_seed``; sequences start in a uniform random state. The best possible
    loss is the chain's conditional entropy, :meth:`conditional_entropy`.
    """

    name = "markov"
    default_seq_len = 64
    options = {"branching": 3, "n_states": None, "chain_seed": 0}

    def __init__(self, d_vocab, n_ctx, seq_len=None, options=None):
        super().__init__(d_vocab, n_ctx, seq_len, options)
        ns = self.opts["n_states"]
        self.n_states = d_vocab if ns is None else check_int(_opt(self.name, "n_states"), ns, 2)
        self._need_vocab(self.n_states, f"n_states={self.n_states} states")
        k = check_int(_opt(self.name, "branching"), self.opts["branching"], 1)
        if k > self.n_states:
            raise AttnlabError(f"task 'markov': option branching={k} is invalid: expected at most "
                               f"n_states={self.n_states}")
        g = torch.Generator().manual_seed(check_int(_opt(self.name, "chain_seed"), self.opts["chain_seed"], 0))
        succ = _distinct(self.n_states, k, self.n_states, g)
        w = -torch.log(torch.rand(self.n_states, k, generator=g, dtype=torch.float64).clamp_min(1e-300))
        self.transition = torch.zeros(self.n_states, self.n_states, dtype=torch.float64)
        self.transition.scatter_(1, succ, w / w.sum(1, keepdim=True))

    def conditional_entropy(self) -> float:
        """H(next | current) in nats, averaged over the state distribution of a sequence's steps."""
        P = self.transition
        dist = torch.full((self.n_states,), 1.0 / self.n_states, dtype=torch.float64)
        h_state = -(P * torch.log(P.clamp_min(1e-300))).sum(1)
        total = 0.0
        for _ in range(self.seq_len - 1):
            total += float(dist @ h_state)
            dist = dist @ P
        return total / (self.seq_len - 1)

    def _batch(self, b, gen, split):
        state = torch.randint(0, self.n_states, (b,), generator=gen)
        u = torch.rand(self.seq_len - 1, b, 1, generator=gen, dtype=torch.float64)
        cdf = self.transition.cumsum(1)
        cols = [state]
        for t in range(self.seq_len - 1):  # inverse-CDF sampling of each next state
            state = torch.searchsorted(cdf[state], u[t]).squeeze(1).clamp(max=self.n_states - 1)
            cols.append(state)
        tokens = torch.stack(cols, dim=1)
        mask = torch.ones_like(tokens, dtype=torch.bool)
        mask[:, 0] = False
        return tokens, mask


class Text(Task):
    """Byte-level language modelling; see :mod:`harness.training.text_corpus` for the corpus and split."""

    name = "text"
    default_seq_len = 128
    options = {"paths": None, "val_fraction": 0.1, "max_bytes": None}

    def __init__(self, d_vocab, n_ctx, seq_len=None, options=None):
        super().__init__(d_vocab, n_ctx, seq_len, options)
        if d_vocab != 256:
            raise AttnlabError(f"task 'text' is byte-level: expected d_vocab=256, the model has d_vocab={d_vocab}")
        frac = float(check_number(_opt(self.name, "val_fraction"), self.opts["val_fraction"], 0.0, 1.0,
                                  high_inclusive=False, expected="a number in (0.0, 1.0)"))
        mb = self.opts["max_bytes"]
        mb = None if mb is None else check_int(_opt(self.name, "max_bytes"), mb, 1)
        self.corpus = load_corpus(self.opts["paths"], frac, mb)
        for split, data in self.corpus.items():
            if len(data) < self.seq_len:
                raise AttnlabError(f"task 'text': the {split} split has {len(data)} bytes, fewer than "
                                   f"seq_len={self.seq_len}")

    def _batch(self, b, gen, split):
        data = self.corpus[split]
        start = torch.randint(0, len(data) - self.seq_len + 1, (b, 1), generator=gen)
        tokens = data[start + torch.arange(self.seq_len)[None]].long()
        mask = torch.ones_like(tokens, dtype=torch.bool)
        mask[:, 0] = False
        return tokens, mask


TASKS: dict[str, type[Task]] = {t.name: t for t in (Induction, Copy, Reverse, Sort, ModularAddition, Markov, Text)}


def check_options(name: Any, options: Any) -> None:
    """Raise ValueError unless ``name`` is a task and ``options`` holds only its option names."""
    if not isinstance(name, str) or name not in TASKS:  # a list or dict name would fail hashing, unnamed
        raise AttnlabError(f"unknown task {name!r}: expected one of {sorted(TASKS)}")
    if not isinstance(options, dict):
        raise AttnlabTypeError(f"task options must be a dict, got {type(options).__name__}")
    unknown = sorted(set(options) - set(TASKS[name].options))
    if unknown:
        raise AttnlabError(f"task {name!r} has no option(s) {unknown}: expected some of {sorted(TASKS[name].options)}")


def make_task(name: str, d_vocab: int, n_ctx: int, seq_len: Optional[int] = None,
              options: Optional[dict] = None) -> Task:
    """The task ``name`` for a model with ``d_vocab`` tokens and ``n_ctx`` positions."""
    check_options(name, options or {})
    return TASKS[name](d_vocab, n_ctx, seq_len, options)


def shifted(logits: Tensor, tokens: Tensor, loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Logits and targets at the masked positions: ``[n, d_vocab]`` and ``[n]``.

    The logits at position t predict the token at t + 1.
    """
    if logits.shape[:2] != tokens.shape or loss_mask.shape != tokens.shape:
        raise AttnlabError(f"shapes disagree: logits {tuple(logits.shape)}, tokens {tuple(tokens.shape)}, "
                           f"loss_mask {tuple(loss_mask.shape)}: expected [batch, pos(, d_vocab)] alike")
    m = loss_mask[:, 1:]
    return logits[:, :-1][m], tokens[:, 1:][m]
