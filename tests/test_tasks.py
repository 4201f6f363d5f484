"""harness.training.tasks: every task's batches checked against an independent recomputation in plain Python."""


import pytest
import torch

from harness.training.tasks import TASKS, make_task, shifted
from harness.training.text_corpus import collect_files, split_files

pytestmark = pytest.mark.usefixtures("one_thread")


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_registry_lists_every_task():
    assert sorted(TASKS) == sorted(["induction", "copy", "reverse", "sort", "modular_addition", "markov", "text"])


@pytest.mark.parametrize("name,vocab,ctx", [("induction", 64, 64), ("copy", 16, 32), ("reverse", 16, 32),
                                            ("sort", 16, 32), ("markov", 16, 64)])
def test_batches_are_seeded_typed_and_in_range(name, vocab, ctx):
    task = make_task(name, vocab, ctx)
    tok, mask = task.batch(16, gen(3))
    tok2, mask2 = task.batch(16, gen(3))
    tok3, _ = task.batch(16, gen(4))
    assert tok.shape == mask.shape == (16, task.seq_len)
    assert tok.dtype == torch.int64 and mask.dtype == torch.bool
    assert int(tok.min()) >= 0 and int(tok.max()) < vocab
    assert not mask[:, 0].any(), "position 0 has no context, so it is never a target"
    assert mask.any(1).all(), "every sequence has a target"
    assert torch.equal(tok, tok2) and torch.equal(mask, mask2)
    assert not torch.equal(tok, tok3)


def test_batches_draw_only_from_the_given_generator():
    before = torch.get_rng_state()
    make_task("markov", 16, 64).batch(4, gen())
    make_task("induction", 64, 64).batch(4, gen())
    assert torch.equal(before, torch.get_rng_state())


def induction_predict(seq):
    """A perfect induction head, in plain Python: find the earlier occurrence of the current
    token and predict what followed it (None when there is none, or several)."""
    preds = [None]
    for t in range(1, len(seq)):
        cur = seq[t - 1]
        hits = [j for j in range(t - 1) if seq[j] == cur]
        preds.append(seq[hits[0] + 1] if len(hits) == 1 else None)
    return preds


def test_induction_targets_are_exactly_what_an_induction_head_predicts():
    task = make_task("induction", 64, 64)
    tok, mask = task.batch(64, gen())
    lengths = set()
    for seq, m in zip(tok.tolist(), mask.tolist(), strict=True):
        targets = [t for t in range(len(seq)) if m[t]]
        n = targets[0] - 1  # the first repeated token (position n) is not a target
        lengths.add(n)
        assert task.min_prefix <= n <= task.seq_len // 2
        assert targets == list(range(n + 1, 2 * n))
        assert len(set(seq[:n])) == n, "prefix tokens are distinct"
        assert seq[n:2 * n] == seq[:n], "the prefix is repeated once"
        preds = induction_predict(seq)
        assert all(preds[t] == seq[t] for t in targets)
    # A varying prefix length means no fixed positional offset solves the task.
    assert len(lengths) > 5


def test_induction_not_distinct_needs_only_two_symbols_and_min_prefix_is_checked():
    tok, mask = make_task("induction", 2, 16, 16, {"distinct": False}).batch(8, gen())
    assert set(tok.unique().tolist()) <= {0, 1}
    with pytest.raises(ValueError, match="min_prefix=9"):
        make_task("induction", 64, 64, 16, {"min_prefix": 9})


@pytest.mark.parametrize("name,fn", [("copy", lambda x: x), ("reverse", lambda x: x[::-1]), ("sort", sorted)])
def test_seq2seq_answers(name, fn):
    task = make_task(name, 12, 32, 21)
    tok, mask = task.batch(32, gen())
    n = 10
    for seq, m in zip(tok.tolist(), mask.tolist(), strict=True):
        x, sep, y = seq[:n], seq[n], seq[n + 1:]
        assert sep == 11 and all(v < 11 for v in x)
        assert y == list(fn(x))
        assert m == [False] * (n + 1) + [True] * n


def test_modular_addition_answers_and_a_disjoint_split():
    p = 7
    task = make_task("modular_addition", 8, 8, options={"p": p, "train_fraction": 0.5})
    train_pairs = set(task.pairs["train"].tolist())
    val_pairs = set(task.pairs["val"].tolist())
    assert train_pairs.isdisjoint(val_pairs) and len(train_pairs | val_pairs) == p * p
    assert len(train_pairs) == round(0.5 * p * p)
    for split, pairs in (("train", train_pairs), ("val", val_pairs)):
        tok, mask = task.batch(64, gen(), split)
        for a, b, eq, c in tok.tolist():
            assert eq == p and c == (a + b) % p and a * p + b in pairs
        assert mask.tolist() == [[False, False, False, True]] * 64


def test_markov_chain_is_sparse_and_batches_follow_it():
    task = make_task("markov", 16, 64, options={"branching": 3, "chain_seed": 1})
    P = task.transition
    assert torch.allclose(P.sum(1), torch.ones(16, dtype=torch.float64))
    assert ((P > 0).sum(1) == 3).all()
    tok, mask = task.batch(256, gen())
    cur, nxt = tok[:, :-1].reshape(-1), tok[:, 1:].reshape(-1)
    assert (P[cur, nxt] > 0).all(), "every step moves along an edge of the chain"
    counts = torch.zeros(16, 16, dtype=torch.float64).index_put_((cur, nxt), torch.ones(cur.numel(),
                                                                 dtype=torch.float64), accumulate=True)
    visits = counts.sum(1, keepdim=True)
    # A frequency from n draws has binomial std <= 0.5 / sqrt(n); allow five of them per state.
    tol = 5 * 0.5 / visits.clamp_min(1).sqrt()
    seen = visits[:, 0] > 0
    assert ((counts / visits.clamp_min(1) - P).abs() <= tol)[seen].all()


def test_markov_true_chain_reaches_its_conditional_entropy():
    """The chain's own log-probabilities as logits score the conditional entropy (the best loss)."""
    task = make_task("markov", 8, 32, 32, {"branching": 2})
    tok, mask = task.batch(2048, gen())
    logits = torch.log(task.transition.clamp_min(1e-30))[tok]
    pred, target = shifted(logits, tok, mask)
    ce = torch.nn.functional.cross_entropy(pred, target).item()
    # 2048 x 31 samples: the Monte-Carlo error of the mean is about 1e-3 nats.
    assert ce == pytest.approx(task.conditional_entropy(), abs=0.01)


def test_text_bytes_come_from_the_files_and_split_by_file(tmp_path):
    contents = {f"f{i}.txt": (f"file {i} " * 40).encode() for i in range(12)}
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
    task = make_task("text", 256, 64, 32, {"paths": [str(tmp_path)], "val_fraction": 0.25})
    split = split_files(collect_files([str(tmp_path)]), 0.25)
    assert split["val"] and split["train"] and not set(split["val"]) & set(split["train"])
    for name in ("train", "val"):
        joined = b"".join(f.read_bytes() for f in split[name])
        tok, mask = task.batch(16, gen(), name)
        for seq in tok.tolist():
            assert bytes(seq) in joined
        assert mask[:, 1:].all() and not mask[:, 0].any()


def test_text_default_corpus_is_the_standard_library():
    task = make_task("text", 256, 128, options={"max_bytes": 200_000})
    tok, _ = task.batch(4, gen())
    assert len(task.corpus["train"]) == 200_000 and len(task.corpus["val"]) > 1000
    assert b"def " in bytes(task.corpus["train"].tolist())
    assert tok.shape == (4, 128)


@pytest.mark.parametrize("call,match", [
    (lambda: make_task("lm", 64, 64), "unknown task 'lm'.*induction"),
    (lambda: make_task("copy", 64, 64, options={"length": 3}), "no option.*length.*n_symbols"),
    (lambda: make_task("induction", 64, 32), "seq_len=64 is longer than the model's n_ctx=32"),
    (lambda: make_task("induction", 16, 64), "needs d_vocab >= 32"),
    (lambda: make_task("copy", 64, 64, 16), "odd"),
    (lambda: make_task("modular_addition", 64, 8), "d_vocab >= 114"),
    (lambda: make_task("modular_addition", 64, 8, 5, {"p": 7}), "expected 4"),
    (lambda: make_task("markov", 8, 64, options={"branching": 9}), "branching=9"),
    (lambda: make_task("text", 64, 128), "d_vocab=256"),
    (lambda: make_task("sort", 64, 64, options={"n_symbols": 64}), "n_symbols=64"),
])
def test_bad_task_requests_name_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_text_needs_two_files_and_existing_paths(tmp_path):
    (tmp_path / "one.txt").write_text("x" * 100)
    with pytest.raises(ValueError, match="at least 2"):
        make_task("text", 256, 64, 8, {"paths": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="nope"):
        make_task("text", 256, 64, 8, {"paths": [str(tmp_path / "nope")]})


def test_batch_arguments_are_checked():
    task = make_task("copy", 8, 32)
    with pytest.raises(ValueError, match="batch_size=0"):
        task.batch(0, gen())
    with pytest.raises(ValueError, match="split='test'"):
        task.batch(2, gen(), "test")
    with pytest.raises(TypeError, match="Generator"):
        task.batch(2, 0)


def test_shifted_pairs_each_masked_target_with_the_prediction_before_it():
    tokens = torch.tensor([[1, 2, 3, 0]])
    mask = torch.tensor([[False, True, False, True]])
    logits = torch.zeros(1, 4, 5)
    logits[0, 0, 2] = 1.0  # position 0 predicts position 1, a target
    logits[0, 2, 4] = 1.0  # position 2 predicts position 3, a target
    logits[0, 1, 0] = 1.0  # position 1 predicts position 2, not a target: left out
    pred, target = shifted(logits, tokens, mask)
    assert target.tolist() == [2, 0] and pred.argmax(-1).tolist() == [2, 4]
    pred, target = shifted(logits, tokens, torch.zeros_like(mask))
    assert pred.shape == (0, 5) and target.numel() == 0
    with pytest.raises(ValueError, match="shapes disagree"):
        shifted(logits[:, :3], tokens, mask)
