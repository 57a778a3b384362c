"""The probes on the frozen encoder's features: linear and k-NN accuracy on the cached features
(uniform test split; ``*_val`` on the validation split where the features stage drew one, by
the same fitted probes), with the ``linear_probe`` and ``knn`` sections they read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedssl.eval.predictions import FILE as PREDICTIONS
from fedssl.evaluations import Evaluation, Metric, Section, evaluated_by, register
from fedssl.params import KnnParams, LinearProbeParams

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

LINEAR_TOP1 = Metric(
    "linear_top1",
    "linear",
    order=10,
    pivot="Linear probe top-1 %",
    pivot_name="linear",
    pivot_costs=True,
    board="ssl",
)
KNN_TOP1 = Metric("knn_top1", "k-NN", order=20, pivot="k-NN top-1 %", pivot_name="knn", board="ssl")

SPLIT = ("train_x", "train_y", "test_x", "test_y")
VAL = ("val_x", "val_y")  # the validation split, when the features stage drew one


def run(ctx: StepContext) -> None:
    from fedssl.data import load_npz
    from fedssl.eval.predictions import write_predictions
    from fedssl.eval.probes import knn_accuracy, linear_probe
    from fedssl.stage.runtime import write_json, write_tsv

    with ctx.run():  # the features are read once the run checked them against their digest
        path = ctx.input("features") / "features.npz"
        split, val = load_npz(path, SPLIT), validation(path)
        curve: list[dict] = []
        predicted: dict = {}  # per test image, each probe's class, under its metric's key
        lp, knn = ctx.exp.linear_probe, ctx.exp.knn
        metrics = {
            **linear_probe(*split.values(), lp, ctx.device, curve, predicted, val),
            **knn_accuracy(*split.values(), knn, ctx.device, predicted=predicted),
        }
        if val is not None:  # the same bank's k-NN on the validation split
            bank = split["train_x"], split["train_y"]
            metrics["knn_top1_val"] = knn_accuracy(*bank, *val, knn, ctx.device)["knn_top1"]
        metrics = {k: round(v, 2) for k, v in metrics.items()}
        write_json(ctx.results_dir / "metrics.json", metrics)
        write_tsv(curve, ctx.results_dir / "linear_epochs.tsv", ["epoch", "loss", "test_top1"])
        write_predictions(ctx.results_dir / PREDICTIONS, split["test_y"], predicted)
        ctx.info["metrics"] = metrics


def validation(path):
    """(features, labels) of the validation split in ``features.npz`` at ``path``, or None."""
    from fedssl.data import load_npz

    found = load_npz(path, (), optional=VAL)
    return tuple(found[k] for k in VAL) if found else None


register(
    Evaluation(
        "evaluate",
        ("linear_probe", "knn"),
        ("features",),
        evaluated_by("features"),
        order=30,
        gpu=True,
        metrics=("metrics.json",),
        plots=("linear_epochs.tsv",),  # the linear probe's loss and test top-1 per epoch
        results=(PREDICTIONS,),  # per test image, each probe's class (the board's)
        declares=(LINEAR_TOP1, KNN_TOP1),
        sections=(
            Section("linear_probe", LinearProbeParams, "the linear probe on the frozen features"),
            Section("knn", KnnParams, "the k-NN classifier on the frozen features"),
        ),
        run=run,
    )
)
