"""The frozen encoder's features of the labelled training and test splits, for the probes, with
the ``features`` section it reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedssl.evaluations import DATA, Evaluation, Section, evaluated_by, register
from fedssl.params import FeatureParams

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def run(ctx: StepContext) -> None:
    import numpy as np

    from fedssl.data.partition import stratified_subset
    from fedssl.eval.probes import extract_features

    f = ctx.exp.features
    with ctx.run() as out:
        encoder = ctx.method.encoder(ctx)
        arrays = {}
        for split in ("train", "test"):
            images, labels = ctx.split(split)
            if split == "train" and f.train_size:
                keep = stratified_subset(labels, f.train_size, ctx.exp.method.seed)
                images, labels = images[keep], labels[keep]
            arrays[f"{split}_x"] = extract_features(
                encoder, images, f.batch_size, ctx.device, f"features ({split})"
            )
            arrays[f"{split}_y"] = labels
        np.savez(out / "features.npz", **arrays)
        ctx.info.update(
            dim=int(arrays["train_x"].shape[1]),
            train=len(arrays["train_y"]),
            test=len(arrays["test_y"]),
        )


register(
    Evaluation(
        "features",
        ("features",),
        (DATA,),
        evaluated_by("features"),
        order=20,
        uses="encoder",
        gpu=True,
        sections=(Section("features", FeatureParams, "for methods evaluated by probes"),),
        run=run,
    )
)
