"""The global model's accuracy that a supervised method's own steps log (FedAvg, FedProx,
MOON, FSL: ``global.json``); no shared stage computes it."""

from fedssl.evaluations import Metric, declare

declare(
    Metric(
        "global_top1",
        "global",
        order=30,
        pivot="Global-model top-1 % (uniform test split, final round)",
        pivot_name="global",
        pivot_costs=True,
    )
)
