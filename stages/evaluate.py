"""Stage: linear probe and k-NN accuracy on the cached features (uniform test split)."""

from __future__ import annotations

from fedssl.data import load_npz
from fedssl.eval.probes import knn_accuracy, linear_probe
from fedssl.stage.context import main_guard
from fedssl.stage.runtime import write_json, write_tsv
from stages.common import context

SPLIT = ("train_x", "train_y", "test_x", "test_y")


def run(argv):
    ctx = context("evaluate", argv, "a params/experiments/<name>.yaml preset")
    with ctx.run():  # the features are read once the run checked them against their digest
        split = load_npz(ctx.input("features") / "features.npz", SPLIT).values()
        curve: list[dict] = []
        metrics = {
            **linear_probe(*split, ctx.exp.linear_probe, ctx.device, curve),
            **knn_accuracy(*split, ctx.exp.knn, ctx.device),
        }
        metrics = {k: round(v, 2) for k, v in metrics.items()}
        write_json(ctx.results_dir / "metrics.json", metrics)
        write_tsv(curve, ctx.results_dir / "linear_epochs.tsv", ["epoch", "loss", "test_top1"])
        ctx.info["metrics"] = metrics


if __name__ == "__main__":
    main_guard(run)
