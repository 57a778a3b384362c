"""IFCA (Ghosh et al., 2020): the server keeps a pool of N models; every client receives the
whole pool and trains the one that fits its own data best (the lowest cross-entropy of its
training data, ties to the lowest index), or a seeded random one while exploring
(``explore_rounds``); the server averages, weighted by data size, what trained within each
cluster (an empty cluster keeps its model). A clustering that collapses onto one model after
exploration for ``patience`` rounds (or in the last round) is recorded as failed
(``memo["failed_at"]``).

* ``download``: the whole pool (N models; bytes counted from those tensors), as ``n.key``;
* ``upload``: the trained model, plus the cluster id n_u (a ledger kind of its own);
* ``evaluate``: how many clusters the clients use, and IFCA's failure rule.

A pool of one is FedAvg. The pool's models are states of ``net`` (scored by a functional call)
and the clients' data is the strategy's (``Strategy(cfg, data)``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedssl.data.augment import to_float
from fedssl.fl.cohort import LocalData
from fedssl.fl.state import FederationConfig, FedState, RoundUpdates
from fedssl.stage.runtime import numpy_rng
from fedssl.strategies.aggregation import fedavg_by_group
from fedssl.strategies.base import Strategy

Tensors = dict[str, torch.Tensor]


class IFCA(Strategy):
    """A pool of models, a cluster per client by its own loss (see the module docstring).
    ``pool``: the N initial model states; ``rules``: the clustering's ``explore_rounds`` and
    ``patience`` (e.g. a method's params section); ``attempt``: which restart of the
    clustering (its exploration draws differ)."""

    def __init__(
        self,
        cfg: FederationConfig,
        data: LocalData,
        pool: list[Tensors],
        net: nn.Module,
        rules,
        attempt: int = 0,
    ):
        super().__init__(cfg, data)
        self.pool0, self.net, self.attempt = pool, net, attempt
        self.explore_rounds, self.patience = rules.explore_rounds, rules.patience
        self.n = len(pool)
        self._choice: dict[int, int] = {}
        self._losses: tuple[int, np.ndarray] | None = None

    # ---------------------------------------------------------------- server state
    def init_server(self, model) -> dict[str, Tensors]:
        return {f"pool{n}": {k: v.clone() for k, v in s.items()} for n, s in enumerate(self.pool0)}

    def model(self, state: FedState, n: int) -> Tensors:
        return state.server[f"pool{n}"]

    def final_model(self, state: FedState) -> Tensors:
        return self.model(state, 0)

    # ---------------------------------------------------------------- client side
    def download(self, state, client) -> Tensors:
        return {f"{n}.{k}": v for n in range(self.n) for k, v in self.model(state, n).items()}

    def exploring(self, state) -> bool:
        return state.round < self.explore_rounds

    def local_start(self, state, client, received) -> Tensors:
        if self.n == 1:
            n = 0
        elif self.exploring(state):
            n = int(
                numpy_rng(self.cfg.seed, "explore", self.attempt, state.round, client).integers(
                    self.n
                )
            )
        else:
            n = int(np.argmin(self.train_losses(state, received)[client]))  # ties: lowest n
        self._choice[client] = n
        prefix = f"{n}."
        return {k[len(prefix) :]: v for k, v in received.items() if k.startswith(prefix)}

    @torch.no_grad()
    def train_losses(self, state, received: Tensors) -> np.ndarray:
        """[clients, N] mean CE of every pool model on every client's training data (what each
        client computes on its own from the models it received), once per round."""
        if self._losses is None or self._losses[0] != state.round:
            data = self.data
            idx = torch.as_tensor(np.concatenate(data.clients), device=data.device)
            owner = torch.as_tensor(
                np.repeat(np.arange(len(data.clients)), data.sizes()), device=data.device
            )
            x, y = to_float(data.images[idx]), data.labels[idx]
            sizes = torch.as_tensor(data.sizes(), device=data.device, dtype=torch.float64)
            out = np.zeros((len(data.clients), self.n))
            self.net.eval()
            for n in range(self.n):
                params = {
                    k[len(f"{n}.") :]: v for k, v in received.items() if k.startswith(f"{n}.")
                }
                per = torch.cat(
                    [
                        F.cross_entropy(
                            functional_call(self.net, params, (xb,)).float(), yb, reduction="none"
                        )
                        for xb, yb in zip(x.split(1024), y.split(1024))
                    ]
                )
                total = torch.zeros(len(data.clients), dtype=torch.float64, device=data.device)
                total.index_add_(0, owner, per.double())
                out[:, n] = (total / sizes).cpu().numpy()
            self._losses = (state.round, out)
        return self._losses[1]

    def group(self, state, client) -> int:
        return self._choice[client]

    def upload(self, state, client, trained) -> Tensors:
        n_u = torch.tensor([self._choice[client]], dtype=torch.int64)
        state.ledger.sent(client, {"n_u": n_u}, "cluster_id")
        return trained

    # ---------------------------------------------------------------- server side
    def aggregate(self, state: FedState, updates: RoundUpdates) -> None:
        self.average_within_clusters(state, updates, list(updates.uploads[0]))
        self.record_choices(state, updates)

    def average_within_clusters(self, state, updates, keys: list[str]) -> None:
        """Each cluster's model: the size-weighted mean of ``keys`` over its clients of the
        round; an empty cluster keeps its model."""
        pooled = fedavg_by_group(updates.uploads, updates.weights, updates.groups, keys)
        for n, avg in pooled.items():
            state.server[f"pool{n}"] = {**self.model(state, n), **avg}

    def record_choices(self, state, updates) -> None:
        """Each client's last cluster, and its rounds while exploring and after."""
        memo = state.memo
        choice = memo.setdefault("last_choice", [-1] * state.num_clients)
        phase = "explore_rounds" if self.exploring(state) else "exploit_rounds"
        counts = memo.setdefault(phase, [0] * state.num_clients)
        for c, n in zip(updates.clients, updates.groups):
            choice[c] = int(n)
            counts[c] += 1

    def evaluate(self, state, round_) -> dict | None:
        used = len({n for n in state.memo["last_choice"] if n >= 0})
        self._failure_rule(state, used)
        return {"clusters_used": used}

    def _failure_rule(self, state, used: int) -> None:
        """IFCA's clustering failure: after exploring, every client on one model for
        ``patience`` rounds in a row, or in the last round."""
        if self.n == 1 or self.exploring(state):
            return
        memo = state.memo
        memo["streak"] = memo.get("streak", 0) + 1 if used == 1 else 0
        last = state.round + 1 == self.cfg.rounds
        if memo["streak"] >= self.patience or (last and used == 1):
            memo.setdefault("failed_at", state.round + 1)
