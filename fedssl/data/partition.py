"""Client partitions of a labelled training set.

Every scheme maps a label vector to one index array per client (indices into ``labels``,
sorted, ``int64``). Everything is a pure function of the labels, the settings and the seed:
``split_clients`` builds ``np.random.default_rng(seed)`` and hands it to the scheme.

Schemes
-------
``iid``
    A random permutation cut into ``num_clients`` nearly equal pieces (sizes differ by <= 1).
``dirichlet``
    Per class ``c``: ``p_c ~ Dir_M(alpha)`` and the class's shuffled samples are cut at the
    cumulative shares ``floor(n_c * cumsum(p_c))``. Dirichlet vectors are drawn in log space
    (``log Gamma(a) = log Gamma(a + 1) + log(U) / a``), so any ``alpha > 0`` is exact and never
    gives NaN: tiny ``alpha`` just yields (near) one-hot vectors, huge ``alpha`` near-uniform
    ones. The cuts keep a float artefact (kept: every committed partition has it): a row's
    shares sum to 1 only up to rounding, so a cut that should be ``n_c`` can floor to
    ``n_c - 1`` and the class's last sample falls through to the last client, whose share may
    be ~1e-51. At ``alpha = 0.1`` over 10 clients the last client holds ~4 single-sample
    classes against ~0.4 on the others, which shows in its label-skew statistics and heat-map
    row (``tests/data/test_partition_rules.py``). ``min_per_client`` guard: up to ``MAX_REDRAWS``
    fresh draws of the proportions; if none passes, the draw with the smallest total shortfall
    is repaired deterministically by moving samples from the largest clients (taking from
    their biggest classes first) to the starved ones. The repair keeps every class's total, so
    the result is still disjoint and complete, and it always terminates.
``shards``
    Each class is cut into ``s_c`` near-equal shards (``1 <= s_c <= min(M, n_c)``, the
    shard counts summing to ``M * k`` and given out so that the largest shard stays as small as
    possible, i.e. roughly in proportion to class size). The shards are laid out grouped by
    class, classes in random order, and dealt round-robin to a random permutation of the
    clients. Because no class has more than ``M`` shards, two shards of one class never land on
    the same client, so every client holds exactly ``k`` distinct classes and every sample is
    used whenever ``K <= M * k <= sum_c min(M, n_c)`` (``K`` = classes present). Outside that
    range the shard total is clipped into it: with too few slots (``M * k < K``) some clients
    hold more than ``k`` classes (one shard per class); with too few samples in small classes
    some hold fewer. All samples are used in every case. For balanced data with ``M * k``
    divisible by ``K`` this is the usual "sort by label, cut into M*k shards, k per client"
    split with equal client sizes.
``class_groups`` (CP-CFL)
    Clients ``0..M-1`` are split into ``G = len(groups)`` contiguous equal blocks; block ``g``
    uses the classes of ``groups[g]``. Each client draws ``major_classes`` of those classes at
    random to receive ``major_count`` samples each, the rest ``minor_count`` each (all of a class
    when it has fewer). Samples are drawn without replacement within a client but independently
    across clients, so **clients may share samples and the union need not cover the data**.
``cyclic_lognormal`` (FedRep's FEMNIST sampler, MpFedcon (150, 3))
    Client ``i`` holds the classes ``(i + j) mod K``, ``j < k``, a log-normal number of samples
    split evenly over them; each class deals its shuffled samples in turn and reshuffles when
    it runs out, so **clients share samples only once a class is exhausted**.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

MAX_REDRAWS = 100  # fresh Dirichlet draws tried before repairing the min-size guard

__all__ = [
    "split_clients",
    "iid",
    "dirichlet",
    "shards",
    "class_groups",
    "cyclic_lognormal",
    "deal",
    "class_counts",
    "stratified_subset",
    "unused_subset",
    "server_seed",
    "plot_heatmap",
    "MAX_REDRAWS",
]


# --------------------------------------------------------------------------- validation
def _as_labels(labels, num_classes: int | None = None) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise ValueError(f"labels must be non-negative, found {int(arr.min())}")
    if num_classes is not None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if arr.size and arr.max() >= num_classes:
            raise ValueError(
                f"label {int(arr.max())} is out of range for num_classes={num_classes}"
            )
    return arr


def _check_clients(labels: np.ndarray, num_clients: int) -> None:
    if int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"num_clients must be a positive integer, got {num_clients}")
    if num_clients > len(labels):
        raise ValueError(f"num_clients={num_clients} exceeds the {len(labels)} samples to split")


def _class_runs(labels: np.ndarray, rng: np.random.Generator):
    """Indices grouped by class, each class's indices in random order.

    Returns ``(classes, sizes, order)``: the present classes (ascending), their sizes, and a
    permutation of ``arange(n)`` in which class ``classes[i]`` occupies one contiguous run.
    """
    perm = rng.permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]
    classes, sizes = np.unique(labels, return_counts=True)
    return classes, sizes.astype(np.int64), order


def _finish(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


# --------------------------------------------------------------------------- dispatch
def split_clients(
    labels: np.ndarray, num_clients: int, scheme, seed: int, num_classes: int | None = None
) -> list[np.ndarray]:
    """Split ``labels`` over ``num_clients`` clients as ``scheme`` (a params scheme model) says.

    Returns one sorted ``int64`` index array per client. ``num_classes`` only validates labels
    (and class ids named by the scheme).
    """
    labels = _as_labels(labels, num_classes)
    _check_clients(labels, num_clients)
    rng = np.random.default_rng(seed)
    kind = getattr(scheme, "kind", None)
    if kind == "iid":
        return iid(labels, num_clients, rng)
    if kind == "dirichlet":
        return dirichlet(labels, num_clients, scheme.alpha, scheme.min_per_client, rng)
    if kind == "shards":
        if num_classes is not None and scheme.classes_per_client > num_classes:
            raise ValueError(
                f"classes_per_client={scheme.classes_per_client} exceeds num_classes={num_classes}"
            )
        return shards(labels, num_clients, scheme.classes_per_client, rng)
    if kind == "class_groups":
        if num_classes is not None:
            bad = sorted({c for g in scheme.groups for c in g if c >= num_classes})
            if bad:
                raise ValueError(f"class_groups names classes {bad} but num_classes={num_classes}")
        return class_groups(
            labels,
            num_clients,
            scheme.groups,
            scheme.major_classes,
            scheme.major_count,
            scheme.minor_count,
            rng,
        )
    if kind == "cyclic_lognormal":
        return cyclic_lognormal(
            labels,
            num_clients,
            scheme.classes_per_client,
            scheme.lognormal_mean,
            scheme.lognormal_sigma,
            scheme.size_offset,
            rng,
        )
    raise ValueError(f"unknown partition scheme kind: {kind!r}")


# --------------------------------------------------------------------------- IID
def iid(labels, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Random permutation cut into nearly equal pieces (sizes differ by at most 1)."""
    labels = _as_labels(labels)
    _check_clients(labels, num_clients)
    return _finish(np.array_split(rng.permutation(len(labels)), num_clients))


# --------------------------------------------------------------------------- Dirichlet
def _dirichlet_rows(alpha: float, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """``rows`` independent Dir_cols(alpha) vectors, stable for any alpha > 0.

    Uses Gamma(a) = Gamma(a + 1) * U^(1/a) in log space, then a max-shifted softmax, so the
    largest entry of every row is exp(0) = 1 before normalising: no underflow to an all-zero row.
    """
    log_g = np.log(rng.gamma(alpha + 1.0, size=(rows, cols)))
    log_u = np.log1p(-rng.random((rows, cols)))  # log of U in (0, 1]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        logits = log_g + log_u / alpha
        top = logits.max(axis=1, keepdims=True)
        w = np.exp(logits - top)
    # a subnormal alpha can overflow log_u / alpha to -inf in a whole row; the alpha -> 0 limit
    # is one-hot on the largest U, so use exactly that
    bad = ~np.isfinite(top[:, 0])
    if bad.any():
        w[bad] = 0.0
        w[bad, np.argmax(log_u[bad], axis=1)] = 1.0
    return w / w.sum(axis=1, keepdims=True)


def _counts_from_shares(p: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Cut class c (size sizes[c]) at floor(sizes[c] * cumsum(p[c])) -> counts [classes, M]."""
    cuts = np.floor(np.cumsum(p, axis=1) * sizes[:, None]).astype(np.int64)
    cuts = np.minimum(cuts, sizes[:, None])
    cuts[:, -1] = sizes
    return np.diff(cuts, axis=1, prepend=0)


def _repair_min_size(counts: np.ndarray, min_per_client: int) -> np.ndarray:
    """Move samples from the largest clients to those below ``min_per_client``.

    Column sums are client sizes, row sums class sizes; the row sums never change. Each pass
    either fills the most starved client or brings the donor down to the minimum, so there are
    at most 2 * M passes.
    """
    counts = counts.copy()
    totals = counts.sum(axis=0)
    while True:
        j = int(np.argmin(totals))
        need = min_per_client - int(totals[j])
        if need <= 0:
            return counts
        donor = int(np.argmax(totals))
        give = min(need, int(totals[donor]) - min_per_client)
        # give > 0 because sum(totals) >= M * min_per_client while client j is short
        for c in np.argsort(-counts[:, donor], kind="stable"):
            if give == 0:
                break
            take = min(give, int(counts[c, donor]))
            counts[c, donor] -= take
            counts[c, j] += take
            totals[donor] -= take
            totals[j] += take
            give -= take


def dirichlet(
    labels, num_clients: int, alpha: float, min_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Per-class Dir_M(alpha) split with a min-size guard (see the module docstring)."""
    labels = _as_labels(labels)
    _check_clients(labels, num_clients)
    if not (alpha > 0 and np.isfinite(alpha)):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    if min_per_client < 0:
        raise ValueError(f"min_per_client must be >= 0, got {min_per_client}")
    if min_per_client * num_clients > len(labels):
        raise ValueError(
            f"min_per_client={min_per_client} for {num_clients} clients needs "
            f"{min_per_client * num_clients} samples but only {len(labels)} exist"
        )
    classes, sizes, order = _class_runs(labels, rng)

    best, best_short = None, None
    for _ in range(MAX_REDRAWS):
        counts = _counts_from_shares(_dirichlet_rows(alpha, len(classes), num_clients, rng), sizes)
        short = int(np.maximum(min_per_client - counts.sum(axis=0), 0).sum())
        if short == 0:
            best = counts
            break
        if best_short is None or short < best_short:
            best, best_short = counts, short
    counts = _repair_min_size(best, min_per_client)

    # class c's run in `order` is cut into consecutive pieces of counts[c, :]
    run_starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    piece_starts = run_starts[:, None] + np.cumsum(counts, axis=1) - counts
    parts = []
    for m in range(num_clients):
        pieces = [order[s : s + k] for s, k in zip(piece_starts[:, m], counts[:, m]) if k]
        parts.append(np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64))
    return _finish(parts)


# --------------------------------------------------------------------------- shards
def _shard_counts(sizes: np.ndarray, total: int, cap: np.ndarray) -> np.ndarray:
    """Shards per class: at least 1, at most cap, summing to ``total``; each extra shard goes to
    the class whose shards are currently largest (ties: lowest class)."""
    s = np.ones(len(sizes), dtype=np.int64)
    for _ in range(total - len(sizes)):
        load = np.where(s < cap, sizes / s, -1.0)
        s[int(np.argmax(load))] += 1
    return s


def shards(
    labels, num_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Label shards: every client gets ``classes_per_client`` distinct classes where feasible
    and every sample is used (see the module docstring for the exact construction)."""
    labels = _as_labels(labels)
    _check_clients(labels, num_clients)
    classes, sizes, order = _class_runs(labels, rng)
    k = len(classes)
    if classes_per_client < 1:
        raise ValueError(f"classes_per_client must be >= 1, got {classes_per_client}")
    if classes_per_client > k:
        raise ValueError(
            f"classes_per_client={classes_per_client} exceeds the {k} classes present in the labels"
        )
    cap = np.minimum(sizes, num_clients)
    total = int(np.clip(num_clients * classes_per_client, k, cap.sum()))
    per_class = _shard_counts(sizes, total, cap)

    run_starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    shard_list = []  # grouped by class, classes in random order
    for c in rng.permutation(k):
        run = order[run_starts[c] : run_starts[c] + sizes[c]]
        shard_list.extend(np.array_split(run, per_class[c]))
    client_of = rng.permutation(num_clients)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for pos, piece in enumerate(shard_list):
        parts[client_of[pos % num_clients]].append(piece)
    return _finish([np.concatenate(p) for p in parts])


# --------------------------------------------------------------------------- FedRep's FEMNIST
def deal(
    pool: np.ndarray, cursor: int, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int]:
    """The next ``n`` items of a shuffled pool from ``cursor``; when the pool runs out it is
    reshuffled with the items already dealt in this call moved to its end, so one call repeats
    an item only when ``n`` exceeds the pool. Returns (items, the pool, the new cursor)."""
    picked: list[np.ndarray] = []
    while n:
        if cursor == pool.size:
            fresh = rng.permutation(pool)
            taken = (
                np.isin(fresh, np.concatenate(picked))
                if picked
                else np.zeros(fresh.size, dtype=bool)
            )
            pool, cursor = np.concatenate([fresh[~taken], fresh[taken]]), 0
        step = min(n, pool.size - cursor)
        picked.append(pool[cursor : cursor + step])
        cursor, n = cursor + step, n - step
    return np.concatenate(picked), pool, cursor


def cyclic_lognormal(
    labels,
    num_clients: int,
    classes_per_client: int,
    mean: float,
    sigma: float,
    offset: float,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Client ``i`` gets the classes ``(i + j) mod K`` (``j < classes_per_client``, ``K`` classes
    present, in ascending order) and ``floor(size_i / classes_per_client)`` samples of each
    (at least 1), ``size_i ~ lognormal(mean, sigma) + offset``; each class deals its samples in a
    shuffled order (:func:`deal`). NOT disjoint once a class is exhausted."""
    labels = _as_labels(labels)
    _check_clients(labels, num_clients)
    classes = np.unique(labels)
    if not 1 <= classes_per_client <= len(classes):
        raise ValueError(
            f"classes_per_client={classes_per_client} must lie in [1, "
            f"{len(classes)}] (the classes present)"
        )
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    cursors = [0] * len(classes)
    sizes = rng.lognormal(mean, sigma, size=num_clients) + offset
    parts = []
    for client, size in enumerate(sizes):
        per_class = max(1, int(size // classes_per_client))
        mine = []
        for j in range(classes_per_client):
            c = (client + j) % len(classes)
            taken, pools[c], cursors[c] = deal(pools[c], cursors[c], per_class, rng)
            mine.append(taken)
        parts.append(np.concatenate(mine))
    return _finish(parts)


# --------------------------------------------------------------------------- CP-CFL groups
def class_groups(
    labels,
    num_clients: int,
    groups: Sequence[Sequence[int]],
    major_classes: int,
    major_count: int,
    minor_count: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """CP-CFL split; NOT disjoint (clients sample independently; see the module docstring)."""
    labels = _as_labels(labels)
    _check_clients(labels, num_clients)
    if len(groups) == 0:
        raise ValueError("class_groups needs at least one group")
    if num_clients % len(groups):
        raise ValueError(
            f"num_clients={num_clients} is not divisible by the {len(groups)} class groups"
        )
    group_classes = [np.unique(np.asarray(g, dtype=np.int64)) for g in groups]
    for i, g in enumerate(group_classes):
        if g.size == 0:
            raise ValueError(f"class group {i} is empty")
        if g.min() < 0:
            raise ValueError(f"class group {i} has a negative class id")
        if major_classes > g.size:
            raise ValueError(
                f"major_classes={major_classes} exceeds the {g.size} classes of group {i}"
            )
    if min(major_count, minor_count) < 0 or major_classes < 0:
        raise ValueError("major_classes, major_count and minor_count must be >= 0")

    wanted = np.unique(np.concatenate(group_classes))
    members = {int(c): np.flatnonzero(labels == c) for c in wanted}
    per_group = num_clients // len(groups)
    parts = []
    for client in range(num_clients):
        g = group_classes[client // per_group]
        major = np.zeros(g.size, dtype=bool)
        major[rng.choice(g.size, size=major_classes, replace=False)] = True
        picked = []
        for c, is_major in zip(g, major):
            pool = members[int(c)]
            n = min(major_count if is_major else minor_count, pool.size)
            if n:
                picked.append(rng.choice(pool, size=n, replace=False))
        parts.append(np.concatenate(picked) if picked else np.empty(0, dtype=np.int64))
    return _finish(parts)


# --------------------------------------------------------------------------- helpers
def class_counts(labels, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """``[clients, classes]`` int64 matrix of per-client class counts."""
    labels = _as_labels(labels, num_classes)
    out = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, p in enumerate(parts):
        out[i] = np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes)
    return out


def stratified_subset(labels, size: int, seed: int) -> np.ndarray:
    """Exactly ``size`` sorted indices; class ``c`` gets ``size * n_c / n`` rounded by largest
    remainder (ties: larger class, then lower class id), drawn at random within the class."""
    labels = _as_labels(labels)
    n = len(labels)
    if not 0 <= size <= n:
        raise ValueError(f"subset size {size} must lie in [0, {n}]")
    rng = np.random.default_rng(seed)
    classes, sizes = np.unique(labels, return_counts=True)
    quota, rem = np.divmod(size * sizes.astype(np.int64), n)
    short = size - int(quota.sum())
    if short:
        rank = np.lexsort((classes, -sizes, -rem))  # last key is the primary one
        quota[rank[:short]] += 1
    picked = [
        rng.choice(np.flatnonzero(labels == c), size=int(q), replace=False)
        for c, q in zip(classes, quota)
        if q
    ]
    return np.sort(np.concatenate(picked)) if picked else np.empty(0, dtype=np.int64)


def unused_subset(labels, held: Sequence[np.ndarray], size: int, seed: int) -> np.ndarray:
    """:func:`stratified_subset` of ``size`` among the indices no array of ``held`` holds (a
    validation split beside the clients, the server slice and a probe's bank): sorted indices
    into ``labels``. Fails, saying how many are free, when fewer than ``size`` are."""
    labels = _as_labels(labels)
    taken = np.concatenate([np.asarray(h, dtype=np.int64) for h in held] or [np.empty(0, np.int64)])
    free = np.setdiff1d(np.arange(len(labels)), taken)
    if size > len(free):
        raise ValueError(f"{size} images asked for but only {len(free)} are held by nobody")
    return free[stratified_subset(labels[free], size, seed)]


def server_seed(partition) -> int:
    """The seed of a partition's server slice (``server_holdout``): its own
    ``server_holdout_seed`` when set, else the partition seed + 1."""
    own = getattr(partition, "server_holdout_seed", None)
    return partition.seed + 1 if own is None else own


def plot_heatmap(counts: np.ndarray, path, title: str) -> None:
    """Clients x classes heat map (annotated when small) with a colour bar, written as a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts must be 2-D [clients, classes], got shape {counts.shape}")
    rows, cols = counts.shape
    width = min(max(4.0, 0.45 * cols + 2.0), 24.0)
    height = min(max(3.0, 0.35 * rows + 1.5), 24.0)
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title)
    ax.set_xticks(_ticks(cols))
    ax.set_yticks(_ticks(rows))
    if rows * cols <= 400 and counts.size:
        top = float(counts.max()) or 1.0
        for (r, c), v in np.ndenumerate(counts):
            ax.text(
                c,
                r,
                f"{int(v)}" if float(v).is_integer() else f"{v:.2g}",
                ha="center",
                va="center",
                fontsize=7,
                color="black" if v > 0.6 * top else "white",
            )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)


def _ticks(n: int) -> np.ndarray:
    step = max(1, int(np.ceil(n / 25)))
    return np.arange(0, n, step)
