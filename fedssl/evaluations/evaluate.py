"""The probes on the frozen encoder's features: linear and k-NN (``stages/evaluate.py``)."""

from fedssl.evaluations import Evaluation, Metric, evaluated_by, register

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
        declares=(LINEAR_TOP1, KNN_TOP1),
    )
)
