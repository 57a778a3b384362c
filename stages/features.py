"""Stage: features of the method's frozen encoder for the labelled train and test splits."""

from __future__ import annotations

import numpy as np

from fedssl.data.partition import stratified_subset
from fedssl.eval.probes import extract_features
from fedssl.stage.context import main_guard
from stages.common import context


def run(argv):
    ctx = context("features", argv, "a params/experiments/<name>.yaml preset")
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


if __name__ == "__main__":
    main_guard(run)
