"""The frozen encoder's features of the labelled training and test splits, for the probes, with
the ``features`` section it reads; with ``validation_size``, also of a validation split of the
training images that neither the probes' bank nor the partition (clients, server) holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedssl.evaluations import DATA, PARTITION, Evaluation, Section, evaluated_by, register
from fedssl.params import FeatureParams

if TYPE_CHECKING:
    import numpy as np

    from fedssl.stage.contract import StepContext

VALIDATION_SEED = "features-validation"  # the validation draw's seed tag (apart from the bank's)


def run(ctx: StepContext) -> None:
    import numpy as np

    from fedssl.eval.probes import extract_features

    f = ctx.exp.features
    with ctx.run() as out:
        sets = _sets(ctx)  # the validation draw fails here, before the encoder runs
        encoder = ctx.method.encoder(ctx)
        arrays = {}
        for name, split, keep in sets:
            images, labels = ctx.split(split)
            if keep is not None:
                images, labels = images[keep], labels[keep]
            arrays[f"{name}_x"] = extract_features(
                encoder, images, f.batch_size, ctx.device, f"features ({name})"
            )
            arrays[f"{name}_y"] = labels
        np.savez(out / "features.npz", **arrays)
        dim = int(arrays["train_x"].shape[1])
        ctx.info.update(dim=dim, **{name: len(arrays[f"{name}_y"]) for name, _, _ in sets})


def _sets(ctx: StepContext) -> list[tuple[str, str, np.ndarray | None]]:
    """(name, split, the split's indices or None for all) of each labelled set: the probes'
    training bank, the test split and, with ``validation_size``, the validation split."""
    from fedssl.data.partition import stratified_subset

    f = ctx.exp.features
    _, labels = ctx.split("train")
    bank = stratified_subset(labels, f.train_size, ctx.exp.method.seed) if f.train_size else None
    sets = [("train", "train", bank), ("test", "test", None)]
    if f.validation_size:
        sets.append(("val", "train", validation_indices(ctx, labels, bank)))
    return sets


def validation_indices(ctx: StepContext, labels: np.ndarray, bank: np.ndarray) -> np.ndarray:
    """``features.validation_size`` class-stratified training images that no client, no server
    slice and not the probes' ``bank`` holds, drawn with a seed of their own."""
    from fedssl.data.partition import unused_subset
    from fedssl.stage.runtime import StageFailed, derive_seed

    held = [bank, *ctx.clients()]
    if ctx.partition.server_holdout:
        held.append(ctx.server_indices())
    size, seed = ctx.exp.features.validation_size, ctx.exp.method.seed
    try:
        return unused_subset(labels, held, size, derive_seed(seed, VALIDATION_SEED))
    except ValueError as e:
        raise StageFailed(
            f"features.validation_size: {e} (outside the probes' bank, partition "
            f"'{ctx.exp.partition}''s clients and server slice): lower validation_size or "
            f"features.train_size, or give the partition a smaller subset"
        ) from None


def _partition_if_validating(exp) -> tuple[str, ...]:
    """The validation split is drawn outside the partition's images: it reads the partition."""
    return (PARTITION,) if exp.features.validation_size else ()


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
        more_inputs=_partition_if_validating,
    )
)
