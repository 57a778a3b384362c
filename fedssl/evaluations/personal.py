"""Personalised evaluation: each client's model on its own test split, every round, summarised
from the ``personal.npz`` its method's step wrote, with the ``personal`` section it reads.
Numbers the step measured itself (restarts, a relevance score, ...) come along when it also
wrote ``extra_metrics.json`` (a flat mapping) beside that file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedssl.evaluations import PARTITION, Evaluation, Metric, Section, evaluated_by, register
from fedssl.params import PersonalEvalParams

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

EXTRA = "extra_metrics.json"

PERSONAL_TOP1 = Metric(
    "personal_top1",
    "personal",
    order=40,
    pivot="Personalised top-1 % (each client's model on its own test split, final round)",
    pivot_name="personal",
    pivot_costs=True,
    board="personal",
)


def run(ctx: StepContext) -> None:
    import json

    from fedssl.eval.personal import summarize
    from fedssl.stage.runtime import write_json

    source = next(ctx.input(step) for step in ctx.method.personal_inputs)
    with ctx.run():
        metrics = summarize(source / "personal.npz", ctx.exp.personal, ctx.true_groups())
        if (source / EXTRA).exists():
            extra = json.loads((source / EXTRA).read_text())
            metrics.update({k: v for k, v in extra.items() if k not in metrics})
        write_json(ctx.results_dir / "metrics.json", metrics)
        ctx.info["metrics"] = metrics


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
        sections=(Section("personal", PersonalEvalParams, "for personalised methods"),),
        run=run,
    )
)
