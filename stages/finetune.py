"""Stage: fine-tune the method's pretrained encoder end to end with a linear head on the
labelled training split (an experiment's `finetune` section), top-1 on the test split."""

from __future__ import annotations

import torch  # noqa: F401  (imported first so that FEDSSL_THREADS applies to it)

from fedssl.data.partition import stratified_subset
from fedssl.eval.finetune import finetune
from fedssl.stage.context import main_guard
from fedssl.stage.runtime import write_json, write_tsv
from stages.common import context


def run(argv):
    ctx = context("finetune", argv, "a params/experiments/<name>.yaml preset")
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


if __name__ == "__main__":
    main_guard(run)
