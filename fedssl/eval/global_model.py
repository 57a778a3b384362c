"""One global supervised model on the test split (global FedAvg / FedProx / MOON, FSL): the
split as one 'client', the number of classes, top-1 accuracy, and the ``train`` step's saved
model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedssl.data import to_device
from fedssl.eval.personal import client_outputs
from fedssl.fl.cohort import LocalData

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


@torch.no_grad()
def global_accuracy(net: nn.Module, weights: dict, tests: LocalData) -> float:
    """Top-1 % of ``net`` with ``weights`` (eval mode) on every image of ``tests``."""
    was = net.training
    net.eval()
    try:
        (acc,), _, _ = client_outputs(
            lambda _c, x: functional_call(net, weights, (x,)),
            tests.images,
            tests.labels,
            tests.clients,
        )
    finally:
        net.train(was)
    return acc


def test_split(ctx: StepContext) -> LocalData:
    """The uniform test split on the stage's device, as one 'client' holding all of it."""
    images, labels = ctx.split("test")
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
    return LocalData(to_device(images, ctx.device), labels.to(ctx.device), [np.arange(len(labels))])


def num_classes(data: LocalData, tests: LocalData) -> int:
    return int(max(data.labels.max(), tests.labels.max())) + 1


def load_saved(ctx: StepContext, device=None) -> dict:
    """The ``train`` step's ``model.pt`` (weights, image shape, classes): the one load site of the
    supervised methods that train one global model, tensors only."""
    path = ctx.input("train") / "model.pt"
    return torch.load(path, map_location=device or ctx.device, weights_only=True)
