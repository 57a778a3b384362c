"""Stage: split a prepared data set's training split over clients (and, as the partition asks,
a server slice, per-client test images and per-client validation images)."""

from __future__ import annotations

import numpy as np

from fedssl.data import VALIDATION_CLIENTS, load_split, save_clients
from fedssl.data.client_tests import (
    class_group_of_client,
    matching_test_split,
    proportional_counts,
)
from fedssl.data.partition import (
    class_counts,
    plot_heatmap,
    server_seed,
    split_clients,
    stratified_subset,
)
from fedssl.plan.layout import data_dir
from fedssl.stage.context import StageFailed, main_guard
from fedssl.stage.runtime import derive_seed, write_json
from stages.common import context

VALIDATION_SEED = "client-validation"  # the validation draw's seed tag (apart from the tests')


def run(argv):
    ctx = context("partition", argv, "a params/partitions/<name>.yaml preset")
    p = ctx.presets.load("partition", ctx.name)
    _, labels = load_split(data_dir(p.dataset), "train")
    num_classes = int(labels.max()) + 1
    server = np.empty(0, dtype=np.int64)
    if p.server_holdout:  # the server's slice first; the clients split what is left
        server = np.sort(stratified_subset(labels, p.server_holdout, server_seed(p)))
    rest = np.setdiff1d(np.arange(len(labels)), server)
    pool = rest[stratified_subset(labels[rest], p.subset, p.seed)] if p.subset else rest
    local = split_clients(labels[pool], p.num_clients, p.scheme, p.seed, num_classes)
    clients = [pool[ix] for ix in local]  # indices into the full training split
    empty = [i for i, c in enumerate(clients) if len(c) == 0]
    if empty:
        where = ctx.presets.resolve("partition", ctx.name).where
        raise StageFailed(
            f"{where}: scheme: client(s) {empty} of {p.num_clients} got no samples: set "
            f"scheme.min_per_client (the draw is repeated until each client has that many) or "
            f"fewer num_clients"
        )
    counts = class_counts(labels, clients, num_classes)
    summary = {"clients": counts.tolist(), "sizes": counts.sum(1).tolist()}
    if p.scheme.kind == "class_groups":  # the true groups, for cluster recovery scores
        summary["groups"] = class_group_of_client(p.num_clients, len(p.scheme.groups)).tolist()
    tests = client_tests(ctx, p, counts)
    val = client_validation(ctx, p, labels, [*clients, server], counts)
    if tests is not None:
        summary["test_sizes"] = [len(t) for t in tests]
    if val is not None:
        summary["val_sizes"] = [len(v) for v in val]
    with ctx.run() as out:
        save_clients(out / "clients.npz", clients)
        if p.server_holdout:
            np.save(out / "server.npy", server)
        if tests is not None:
            save_clients(out / "test_clients.npz", tests)
        if val is not None:
            save_clients(out / VALIDATION_CLIENTS, val)
        write_json(out / "class_counts.json", summary)
        plot_heatmap(counts, out / "heatmap.png", f"{ctx.name}: samples per client and class")
        ctx.info.update(
            num_clients=len(clients),
            samples=int(counts.sum()),
            server_samples=int(len(server)),
            smallest_client=int(counts.sum(1).min()),
            largest_client=int(counts.sum(1).max()),
        )


def client_tests(ctx, p, counts: np.ndarray) -> list[np.ndarray] | None:
    """Each client's test indices with its class mix (``client_tests``), or None."""
    if not p.client_tests:
        return None
    _, test_labels = load_split(data_dir(p.dataset), "test")
    wanted, per_client = counts, p.client_tests.per_client
    if p.client_tests.fraction is not None:  # a share of each client's training size
        wanted = np.stack(
            [proportional_counts(c, round(p.client_tests.fraction * c.sum())) for c in counts]
        )
    try:
        return matching_test_split(
            wanted,
            test_labels,
            per_client,
            p.seed,
            replace_across_clients=not p.client_tests.disjoint,
        )
    except ValueError as e:
        raise StageFailed(f"{ctx.name}: client_tests: {e}") from None


def client_validation(ctx, p, labels, held: list[np.ndarray], counts) -> list[np.ndarray] | None:
    """Each client's validation indices into the training split (``validation_per_client``),
    with its class mix like its test images, among the images nothing in ``held`` holds; drawn
    with a seed of their own. None when not asked for."""
    size = p.client_tests.validation_per_client if p.client_tests else None
    if size is None:
        return None
    free = np.setdiff1d(np.arange(len(labels)), np.concatenate(held))
    seed = derive_seed(p.seed, VALIDATION_SEED)
    try:
        picked = matching_test_split(
            counts,
            labels[free],
            size,
            seed,
            replace_across_clients=not p.client_tests.disjoint,
            what="validation images",
        )
    except ValueError as e:
        raise StageFailed(
            f"{ctx.name}: client_tests.validation_per_client: {e} among the training images "
            f"no client and no server slice holds: lower validation_per_client, or give the "
            f"partition a smaller subset (or server_holdout)"
        ) from None
    return [free[v] for v in picked]


if __name__ == "__main__":
    main_guard(run)
