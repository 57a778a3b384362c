"""Stage: split a prepared data set's training split over clients."""
from __future__ import annotations

import numpy as np

from fedssl.data.partition import class_counts, plot_heatmap, split_clients, stratified_subset
from fedssl.data.store import load_split, save_clients
from fedssl.pipeline import data_dir
from fedssl.runtime import write_json
from fedssl.stage import main_guard
from stages.common import context


def run(argv):
    ctx = context("partition", argv, "a params/partitions/<name>.yaml preset")
    p = ctx.presets.load("partition", ctx.name)
    _, labels = load_split(data_dir(p.dataset), "train")
    num_classes = int(labels.max()) + 1
    pool = (stratified_subset(labels, p.subset, p.seed) if p.subset
            else np.arange(len(labels)))
    local = split_clients(labels[pool], p.num_clients, p.scheme, p.seed, num_classes)
    clients = [pool[ix] for ix in local]  # indices into the full training split
    counts = class_counts(labels, clients, num_classes)
    with ctx.run() as out:
        save_clients(out / "clients.npz", clients)
        write_json(out / "class_counts.json", {"clients": counts.tolist(),
                                               "sizes": counts.sum(1).tolist()})
        plot_heatmap(counts, out / "heatmap.png", f"{ctx.name}: samples per client and class")
        ctx.info.update(num_clients=len(clients), samples=int(counts.sum()),
                        smallest_client=int(counts.sum(1).min()),
                        largest_client=int(counts.sum(1).max()))


if __name__ == "__main__":
    main_guard(run)
