"""The preallocated KV cache: written in place, never regrown when the length is known, equal to recomputation."""

import pytest
import torch

from harness import KVCache, ModelConfig, Transformer
from harness.errors import AttnlabError
from harness.model.kv_cache import KVCacheEntry


def small(**kw) -> Transformer:
    base = dict(n_layers=2, d_model=32, n_heads=4, d_vocab=50, n_ctx=64, seed=3, init_range=0.2,
                positional_embedding_type="rotary")
    base.update(kw)
    return Transformer(ModelConfig(**base)).eval()


def tokens(batch=2, pos=20, seed=0):
    return torch.randint(0, 50, (batch, pos), generator=torch.Generator().manual_seed(seed))


def test_storage_is_allocated_once_and_written_in_place():
    entry = KVCacheEntry(capacity=8)
    pointers = set()
    for step in range(8):
        k = torch.full((1, 2, 1, 4), float(step))
        keys, values = entry.extend(k, -k)
        pointers.add(entry.k_storage.data_ptr())
        assert keys.shape == (1, 2, step + 1, 4) and keys.data_ptr() == entry.k_storage.data_ptr()
    assert len(pointers) == 1 and entry.k_storage.shape[2] == 8  # never reallocated, never grown
    torch.testing.assert_close(entry.k[0, 0, :, 0], torch.arange(8.0), rtol=0, atol=0)
    torch.testing.assert_close(entry.v, -entry.k, rtol=0, atol=0)


def test_storage_doubles_past_its_capacity_and_keeps_what_it_held():
    entry = KVCacheEntry()  # no capacity: grows by doubling (amortized O(1) copying per token)
    sizes = []
    for step in range(9):
        entry.extend(torch.full((1, 1, 1, 1), float(step)), torch.zeros(1, 1, 1, 1))
        sizes.append(entry.k_storage.shape[2])
    assert sizes == [1, 2, 4, 4, 8, 8, 8, 8, 16]
    assert entry.k.flatten().tolist() == [float(s) for s in range(9)]


def test_generate_never_reallocates_the_cache(monkeypatch):
    model = small()
    allocations = []
    real = KVCacheEntry.extend

    def counting(self, k, v):
        before = None if self.k_storage is None else self.k_storage.data_ptr()
        out = real(self, k, v)
        if before != self.k_storage.data_ptr():
            allocations.append(self.k_storage.shape[2])
        return out

    monkeypatch.setattr(KVCacheEntry, "extend", counting)
    model.generate(tokens(2, 5), 12, temperature=0)
    assert allocations == [5 + 12] * model.cfg.n_layers  # one allocation per layer, at the final length


@pytest.mark.parametrize("pos_type", ["rotary", "standard", "alibi"])
def test_chunked_decoding_through_growth_equals_recomputation(pos_type):
    """Left-padded prompt, then chunks of 1-3 tokens past every doubling: equal to one full forward."""
    model = small(positional_embedding_type=pos_type)
    t = tokens(3, 24)
    mask = torch.ones(3, 24, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :9] = 0
    cache, outs, start = KVCache(model.cfg.n_layers), [], 0
    for size in (6, 1, 2, 3, 1, 1, 3, 2, 5):
        outs.append(model(t[:, start:start + size], attention_mask=mask[:, start:start + size], kv_cache=cache))
        start += size
    assert start == 24 and cache.length == 24 and cache.layers[0].k_storage.shape[2] >= 24
    full = model(t, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(torch.cat(outs, 1)[real], full[real], atol=1e-5, rtol=0)
    assert torch.equal(cache.mask, real)


def test_forward_with_cache_equals_a_full_forward():
    model = small()
    t = tokens(2, 16)
    logits, past = model.forward_with_cache(t[:, :7])
    steps = [logits]
    for i in range(7, 16):
        logits, past = model.forward_with_cache(t[:, i:i + 1], past=past)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), model(t), atol=1e-5, rtol=0)
    assert past.mask is None  # no padding seen: the mask stays absent (SDPA's is_causal fast path)


def test_bad_capacity_is_one_error():
    with pytest.raises(AttnlabError, match=r"capacity=0 is invalid"):
        KVCache(2, capacity=0)


@pytest.mark.parametrize("pos_type", ["standard", "rotary", "alibi"])
def test_a_prefix_of_a_full_cache_continues_the_sequence(pos_type):
    """``KVCache.prefix(p, repeat=k, layers=l..)``: a pass from layer l over positions p.. of k stacked copies
    equals the full pass at those positions, and leaves the cache it came from as it was."""
    model, t = small(positional_embedding_type=pos_type), tokens(2, 12)
    full = KVCache(2, capacity=12)
    with torch.no_grad():
        want = model(t, kv_cache=full)
        resid = model(t, stop_at_layer=1)
        keys = full.layers[1].k.clone()
        cache = full.prefix(5, repeat=3, layers=[1])
        assert cache.length == 5 and cache.layers[0].k is None and cache.layers[1].k.shape == (6, 4, 5, 8)
        got = model(resid[:, 5:].repeat(3, 1, 1), start_at_layer=1, kv_cache=cache)
    for i in range(3):
        torch.testing.assert_close(got[i * 2:(i + 1) * 2], want[:, 5:], atol=1e-5, rtol=0)
    assert torch.equal(full.layers[1].k, keys) and full.length == 12


@pytest.mark.parametrize("kwargs, match", [
    (dict(length=13), "length=13 is past the 12 cached tokens"),
    (dict(length=0), "length=0 is invalid"),
    (dict(length=4, repeat=0), "repeat=0 is invalid"),
])
def test_bad_prefix_is_one_error(kwargs, match):
    full = KVCache(2, capacity=12)
    with torch.no_grad():
        small()(tokens(2, 12), kv_cache=full)
    with pytest.raises(AttnlabError, match=match):
        full.prefix(**kwargs)


def test_a_prefix_of_layers_no_pass_wrote_is_refused():
    with pytest.raises(AttnlabError, match="layer 0 of the cache holds no keys"):
        _empty_with_length(4).prefix(2)


def _empty_with_length(n: int) -> KVCache:
    cache = KVCache(2, capacity=n)
    cache.length = n
    return cache
