"""Fine-tuning the method's pretrained encoder end to end with a linear head on the labelled
training split, top-1 on the test split, for experiments with a ``finetune`` section (the
experiment's choice, for methods whose encoder can be trained: ``finetunable``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedssl.evaluations import DATA, Evaluation, Metric, Section, register
from fedssl.params import FinetuneParams

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

FINETUNE_TOP1 = Metric("finetune_top1", "fine-tune", order=50, board="ssl")


def run(ctx: StepContext) -> None:
    from fedssl.data.partition import stratified_subset
    from fedssl.eval.finetune import finetune
    from fedssl.stage.runtime import write_json, write_tsv

    p = ctx.exp.finetune
    with ctx.run():
        encoder = ctx.method.encoder(ctx)
        images, labels = ctx.split("train")
        if p.train_size:
            keep = stratified_subset(labels, p.train_size, p.seed)
            images, labels = images[keep], labels[keep]
        log_path = ctx.results_dir / "finetune_epochs.tsv"

        def on_epoch(rows):
            write_tsv(rows, log_path, ["epoch", "loss"])
            print(f"epoch {rows[-1]['epoch']}/{p.epochs}: loss {rows[-1]['loss']:.4f}", flush=True)

        result = finetune(
            encoder,
            (images, labels),
            ctx.split("test"),
            p,
            ctx.device,
            ctx.resume_path,
            ctx.fingerprint,
            on_epoch,
        )
        write_tsv(result.pop("log"), log_path, ["epoch", "loss"])
        metrics = {k: round(v, 2) for k, v in result.items() if v is not None}
        write_json(ctx.results_dir / "finetune.json", metrics)
        ctx.info.update(metrics=metrics, train=len(labels))
    ctx.done()


def _refuse(method) -> str | None:
    return None if method.finetunable else "has no encoder to fine-tune"


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
        sections=(
            Section(
                "finetune",
                FinetuneParams,
                "also fine-tune the encoder end to end (methods whose encoder can be trained: "
                "`finetunable`)",
                by_method=False,
                refuse=_refuse,
            ),
        ),
        run=run,
    )
)
