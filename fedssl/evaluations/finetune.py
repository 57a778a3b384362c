"""Fine-tuning the encoder end to end with a linear head, for experiments with a ``finetune``
section (``stages/finetune.py``)."""

from fedssl.evaluations import DATA, Evaluation, Metric, register

FINETUNE_TOP1 = Metric("finetune_top1", "fine-tune", order=50, board="ssl")

register(
    Evaluation(
        "finetune",
        ("finetune",),
        (DATA,),
        lambda method, exp: exp.finetune is not None,
        order=40,
        uses="encoder",
        gpu=True,
        metrics=("finetune.json",),
        plots=("finetune_epochs.tsv",),
        declares=(FINETUNE_TOP1,),
    )
)
