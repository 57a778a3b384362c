"""Personalised evaluation: each client's model on its own test split, summarised from the
steps of the method that logged it (``stages/personal.py``)."""

from fedssl.evaluations import PARTITION, Evaluation, Metric, evaluated_by, register

PERSONAL_TOP1 = Metric(
    "personal_top1",
    "personal",
    order=40,
    pivot="Personalised top-1 % (each client's model on its own test split, final round)",
    pivot_name="personal",
    pivot_costs=True,
    board="personal",
)

register(
    Evaluation(
        "personal",
        ("personal",),
        (PARTITION,),
        evaluated_by("personal"),
        order=10,
        uses="personal",
        metrics=("metrics.json",),
        declares=(PERSONAL_TOP1,),
    )
)
