"""Average-linkage (UPGMA) hierarchical clustering for the head-similarity clustermap.

seaborn's ``clustermap`` needs scipy, which attnlab does not otherwise depend on; a model has at
most a few hundred heads, so the textbook O(n^3) agglomeration (Sokal & Michener 1958) is instant.
"""

from __future__ import annotations

import numpy as np

from harness.errors import AttnlabError


def average_linkage(distance: np.ndarray) -> tuple[list[int], list[tuple[int, int, float]]]:
    """Leaf order and merges of UPGMA clustering on a symmetric distance matrix.

    Returns ``(order, links)``: ``order`` lists the leaves left to right so that every cluster is
    contiguous; ``links[k] = (a, b, height)`` merges clusters ``a`` and ``b`` into cluster
    ``n + k`` (leaves are ``0 .. n-1``) at the average pairwise distance ``height``, as in scipy.
    Ties go to the lowest cluster ids, so the result is deterministic.
    """
    d = np.asarray(distance, dtype=float)
    if d.ndim != 2 or d.shape[0] != d.shape[1] or d.shape[0] == 0:
        raise AttnlabError(f"distance must be a non-empty square matrix, got shape {d.shape}")
    if not np.isfinite(d).all():
        raise AttnlabError("distance must be finite everywhere")
    if not np.allclose(d, d.T, atol=1e-6):
        raise AttnlabError("distance must be symmetric")
    n = d.shape[0]
    # Average linkage: the distance between clusters is the mean over all pairs of their members,
    # which updates as a size-weighted mean of the merged clusters' distances (Lance-Williams).
    active = {i: [i] for i in range(n)}  # cluster id -> leaves in display order
    dist = {(i, j): float(d[i, j]) for i in range(n) for j in range(i + 1, n)}
    links: list[tuple[int, int, float]] = []
    next_id = n
    while len(active) > 1:
        (a, b), height = min(dist.items(), key=lambda kv: (kv[1], kv[0]))
        size_a, size_b = len(active[a]), len(active[b])
        merged = active.pop(a) + active.pop(b)
        for c in active:
            dac = dist.pop(_key(a, c))
            dbc = dist.pop(_key(b, c))
            dist[_key(c, next_id)] = (size_a * dac + size_b * dbc) / (size_a + size_b)
        del dist[(a, b)]
        links.append((a, b, height))  # average linkage never inverts, so heights only grow
        active[next_id] = merged
        next_id += 1
    order = next(iter(active.values()))
    return order, links


def _key(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)

