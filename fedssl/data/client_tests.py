"""Per-client test sets that mirror each client's training label mix, and true client groups.

Label-skewed federated papers score every client on a local test set drawn like its training
set: CP-CFL (cp-cfl spec §4, §8.3-8.4) gives each client 50 test images with the same
per-class counts as its 20/20/5/5 training split; MpFedcon/FedRep test each party on its own
classes (e.g. 50 images per party). Test images are drawn independently per client, without
replacement within a client: the test split is too small for disjoint draws at K=60.

``class_groups`` in :mod:`fedssl.data.partition` puts client ``m`` in group
``m // (num_clients // len(groups))`` (contiguous equal blocks); :func:`class_group_of_client`
reproduces that, and :func:`groups_from_counts` recovers the group from class counts alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "proportional_counts",
    "matching_test_split",
    "class_group_of_client",
    "groups_from_counts",
]


def proportional_counts(counts, total: int) -> np.ndarray:
    """Split ``total`` over classes in proportion to ``counts``, by largest remainder.

    Ties in the remainder go to the class with more training samples, then the lower class id,
    so e.g. ``[30, 10, 0]`` with total 7 gives ``[5, 2, 0]``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    n = int(counts.sum())
    if n == 0:
        if total:
            raise ValueError("cannot spread test images over a client with no training samples")
        return np.zeros_like(counts)
    quota, remainder = np.divmod(total * counts, n)
    short = total - int(quota.sum())
    order = np.lexsort((np.arange(counts.size), -counts, -remainder))  # last key is primary
    quota[order[:short]] += 1
    return quota


def _test_pools(test_labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
    if test_labels.ndim != 1:
        raise ValueError(f"test_labels must be 1-D, got shape {test_labels.shape}")
    if test_labels.size and (test_labels.min() < 0 or test_labels.max() >= num_classes):
        raise ValueError(f"test labels must lie in [0, {num_classes}) to match train_counts")
    return [np.flatnonzero(test_labels == c) for c in range(num_classes)]


def matching_test_split(
    train_counts,
    test_labels,
    per_client: int | None = None,
    seed: int = 0,
    replace_across_clients: bool = True,
    what: str = "test images",
) -> list[np.ndarray]:
    """Test indices per client with the class mix of its training data.

    ``train_counts`` is ``[clients, classes]``; ``per_client=None`` copies each client's counts
    exactly, an integer rescales them to that many images (:func:`proportional_counts`).
    Within a client images never repeat. ``replace_across_clients=True`` draws every client
    independently (clients may share test images); ``False`` hands out each image at most once
    and fails when a class runs out. Returns one sorted int64 index array per client.
    """
    train_counts = np.asarray(train_counts, dtype=np.int64)
    if train_counts.ndim != 2 or (train_counts < 0).any():
        raise ValueError("train_counts must be a [clients, classes] matrix of counts >= 0")
    pools = _test_pools(np.asarray(test_labels, dtype=np.int64), train_counts.shape[1])
    rng = np.random.default_rng(seed)
    parts = []
    for client, counts in enumerate(train_counts):
        wanted = counts if per_client is None else proportional_counts(counts, per_client)
        picked = []
        for c in np.flatnonzero(wanted):
            if wanted[c] > pools[c].size:
                raise ValueError(
                    f"client {client} needs {wanted[c]} {what} of class {c} but only "
                    f"{pools[c].size} are {'left' if not replace_across_clients else 'there'}"
                )
            chosen = rng.choice(pools[c], size=int(wanted[c]), replace=False)
            if not replace_across_clients:
                pools[c] = np.setdiff1d(pools[c], chosen, assume_unique=True)
            picked.append(chosen)
        parts.append(np.sort(np.concatenate(picked)) if picked else np.empty(0, np.int64))
    return [p.astype(np.int64) for p in parts]


def class_group_of_client(num_clients: int, num_groups: int) -> np.ndarray:
    """The group of every client under ``partition.class_groups``: contiguous equal blocks."""
    if num_groups < 1 or num_clients % num_groups:
        raise ValueError(f"num_clients={num_clients} is not divisible by {num_groups} groups")
    return np.arange(num_clients, dtype=np.int64) // (num_clients // num_groups)


def groups_from_counts(train_counts, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """The group of each client: the one class set that contains every class it holds.

    Fails when no set or several sets fit (a client holding only a class two groups share).
    """
    train_counts = np.asarray(train_counts)
    sets = [set(int(c) for c in g) for g in groups]
    out = np.empty(len(train_counts), dtype=np.int64)
    for client, counts in enumerate(train_counts):
        held = set(np.flatnonzero(counts).tolist())
        fits = [g for g, s in enumerate(sets) if held <= s]
        if len(fits) != 1:
            which = f"several class groups {fits}" if fits else "no class groups"
            raise ValueError(f"client {client} holds classes {sorted(held)}, which fit {which}")
        out[client] = fits[0]
    return out
