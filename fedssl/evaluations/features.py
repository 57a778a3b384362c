"""The frozen encoder's features of the training and test splits, for the probes
(``stages/features.py``)."""

from fedssl.evaluations import DATA, Evaluation, evaluated_by, register

register(
    Evaluation(
        "features",
        ("features",),
        (DATA,),
        evaluated_by("features"),
        order=20,
        uses="encoder",
        gpu=True,
    )
)
