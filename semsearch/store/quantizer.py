"""An IVF index's coarse quantizer trained in two levels, for the list counts of large indexes.

faiss trains an IVF quantizer by k-means over every list at once: at 10M chunks (12,649 lists, a
493k-vector sample) that took 650-708 s of one of the build's two cores (docs/benchmarks.md), and
the final merge added the vectors of every segment the stream published meanwhile. In two levels
(hierarchical k-means, as `faiss.contrib.clustering.two_level_clustering` does it): ~sqrt(nlist)
coarse clusters, then each coarse cluster's points clustered into its share of the lists. On the
1M benchmark's vectors (4,000 lists, 200k sample, one thread) that took 3.0 s against 37.7 s, and
the lists held more of each query's true neighbours at every nprobe (IVF-Flat recall@10 0.885
against 0.823 at nprobe 1, 0.992 against 0.973 at 2; fast scan, 400k vectors, 2,500 lists: 0.978
against 0.931 at nprobe 1). faiss's helper is followed step by step here rather than called: it
asks k-means for zero centroids where a small coarse cluster's share of the lists rounds to none,
which faiss refuses (RuntimeError in subsample_training_set).

Spherical k-means at both levels: the vectors are L2-normalised and searched by inner product,
so the centroids are normalised too and the inner product ranks them as the distance would.

Vectors are still assigned to lists by faiss (every centroid compared): assigning through the two
levels (the fine centroids of a vector's 4 nearest coarse clusters, ~10x less work at 12,649 lists)
agreed with exact assignment for ~99% of vectors but lost recall where it mattered (fast scan,
2,500 lists: 0.992 against 1.000 at nprobe 4), since the vectors it puts elsewhere are the ones
near a boundary that a query's probes rely on; its coarse clusters are too wide (fine centroids
up to 1.34 from their coarse one) for a bound that would make it exact. Nor in bf16 on AMX (the
product for each vector's best 4 centroids, rescored in fp32: 1.83x faiss's speed on one core,
the same list for 99.982%): faiss takes given lists only through add_core, which for fast-scan
indexes is IndexIVF's generic one, writing unpacked codes into block-packed lists (a heap overflow
at 8 sub-quantizers; silently wrong codes at 96)."""
from __future__ import annotations

import numpy as np

# faiss warns on stderr of a k-means with fewer than 39 points a centroid; the sample gives ~39 a
# list in all, some coarse clusters a few less (4,470 points for 115 lists at 10M chunks): fine for
# IVF lists, and the warnings (one a cluster) are noise in a build's output
MIN_POINTS = 5


def two_level(sample: np.ndarray, nlist: int, seed: int = 1234, niter: int = 10) -> np.ndarray:
    """nlist centroids (float32, normalised) from ~sqrt(nlist) coarse clusters of `sample`, each
    given lists in proportion to its share of the sample (faiss's `rebalance`)."""
    import faiss

    x = np.ascontiguousarray(sample, np.float32)
    if len(x) < nlist:
        raise ValueError(f"{nlist} lists need at least as many training vectors (got {len(x)})")
    d = x.shape[1]
    nc1 = max(1, int(np.sqrt(nlist)))
    top = faiss.Kmeans(d, nc1, niter=niter, seed=seed, spherical=True, max_points_per_centroid=2000,
                       min_points_per_centroid=MIN_POINTS)
    top.train(x)
    _, first = top.index.search(x, 1)
    first = first[:, 0]
    counts = np.bincount(first, minlength=nc1)
    lists = np.diff(np.concatenate([[0], np.cumsum(counts) * nlist // len(x)]))  # sums to nlist
    order = np.argsort(first, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(counts)])
    fine = []
    for g in range(nc1):
        k = int(lists[g])
        pts = x[order[bounds[g]:bounds[g + 1]]]
        if k >= len(pts):  # as many lists as points (0 or 1 of each, while nlist <= the sample)
            fine.append(pts[:k])
        elif k:
            km = faiss.Kmeans(d, k, niter=niter, seed=seed + g, spherical=True, min_points_per_centroid=MIN_POINTS)
            km.train(pts)
            fine.append(km.centroids)
    return np.ascontiguousarray(np.vstack(fine), np.float32)
