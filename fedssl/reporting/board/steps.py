"""What a line's params say of its local training: the optimizer steps a client of the
partition's mean size takes in a round (its local epochs x its images over the batch, rounded
up). Lines that train the same encoder on the same data differ here by their batch alone, so
the column shows which line bought its accuracy with more steps (Orchestra's batch of 32)."""

from __future__ import annotations

import math

from fedssl.data.catalog import raw_train_size
from fedssl.params import federation_of
from fedssl.presets import Presets
from fedssl.stage.record import ParamsError

COLUMN = "local_steps"
HEADER = "local steps / round / client"


def local_steps(experiment: str, presets: Presets) -> int | None:
    """A mean client's optimizer steps a round, from the experiment's params; None where
    its method federates no local training with an epoch count and a batch, or the
    experiment is no preset (an override run)."""
    try:
        exp = presets.load("experiment", experiment)
        part = presets.load("partition", exp.partition)
    except (KeyError, ParamsError):
        return None
    block = federation_of(exp.method)
    epochs = getattr(block, "local_epochs", None)
    batch = getattr(block, "batch_size", None)
    images = part.subset or _train_size(part.dataset, presets)
    if epochs is None or batch is None or not images:
        return None
    return epochs * math.ceil(images / part.num_clients / batch)


def _train_size(dataset: str, presets: Presets) -> int | None:
    """The data set's training samples where its files are here to tell them, else None."""
    params = presets.load("dataset", dataset)
    try:
        return raw_train_size(params.name, params.data_root)
    except (OSError, ValueError):
        return None


def with_local_steps(rows: list[dict], presets: Presets | None = None) -> list[dict]:
    """The report's rows with :data:`COLUMN` added where the params tell it."""
    presets = presets or Presets()
    steps = {r["experiment"]: local_steps(r["experiment"], presets) for r in rows}
    return [r | {COLUMN: steps[r["experiment"]]} if steps[r["experiment"]] else r for r in rows]
