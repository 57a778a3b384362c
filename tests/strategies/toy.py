"""A toy federation for the strategies' tests: a linear model fit by least squares, each
client's data with its own optimum (labels are the targets), full-batch plain SGD."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig
from fedssl.fl.state import FederationConfig
from fedssl.rounds.loop import Federation, LocalTraining

DIM = 3


def toy_clients(sizes=(8, 8, 8), seed: int = 0) -> LocalData:
    """Images are the features (uint8, [N, 1, 1, DIM]); client i's targets cluster at 10 i."""
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    images = torch.randint(0, 256, (n, 1, 1, DIM), dtype=torch.uint8, generator=g)
    bounds = np.cumsum([0, *sizes])
    labels = torch.cat(
        [torch.randint(10 * i, 10 * i + 5, (s,), generator=g) for i, s in enumerate(sizes)]
    )
    clients = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    return LocalData(images, labels, clients)


def features(batch) -> tuple:
    return (batch.float().flatten(1) / 255,)


def squared_error(model, params, buffers, batch):
    pred = functional_call(model, (params, buffers), (batch.views[0],)).squeeze(-1)
    err = (pred - batch.labels.float()) ** 2
    return (err * batch.valid).sum() / batch.valid.sum()


def linear(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(DIM, 1)


def federation(strategy, data: LocalData, tmp_path, rounds=1, lr=0.1, steps=5):
    """``strategy(cfg)`` over ``data`` with full-batch SGD for ``steps`` local epochs."""
    model = linear()
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = FederationConfig(rounds=rounds, client_fraction=1.0, lr=lr)
    s = strategy(cfg)
    cohort = CohortTrainer(
        model,
        lambda b, g: features(b),
        s.local_objective(squared_error, model),
        OptimizerConfig("sgd", momentum=0.0),
        batch_size=max(data.sizes()),
        local_epochs=steps,
        parallel=False,
    )
    return model, Federation(s, LocalTraining(cohort), data, cfg, tmp_path / "c.pt", "toy")


def global_optimum(data: LocalData) -> torch.Tensor:
    """The least-squares fit over every client's data (equal-size clients: the minimiser of
    the clients' mean objective)."""
    x = features(data.images)[0]
    x1 = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    return torch.linalg.lstsq(x1, data.labels.double()[:, None]).solution.squeeze(1)
