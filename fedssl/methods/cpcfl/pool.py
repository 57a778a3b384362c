"""CP-CFL's pool of N models (Alg. 2) on the engine's hooks:

* ``download``: the whole pool (N models; bytes counted from those tensors);
* ``local_start``: the client's choice n_u: at random while t < T_c, afterwards the model with
  the lowest cross-entropy on its own training data (eval mode, ties to the lowest index);
* ``trainable``: the heads only while t < T_c (the encoder stays bit-identical);
* ``upload``: the trained model, plus n_u (a ledger kind of its own);
* ``aggregate``: size-weighted FedAvg within each cluster of what trained this round; an empty
  cluster keeps its model; optionally the encoder averaged over every client (global encoder);
* ``evaluate``: each client's accuracy on its own test split with its cluster's new model
  (:class:`fedssl.eval.personal.PersonalLog`), ARI of the choices, IFCA's failure rule.

FedAvg is the pool of one.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedssl.data.augment import to_float
from fedssl.eval.metrics import adjusted_rand_index
from fedssl.eval.personal import PersonalLog, client_outputs
from fedssl.fl.cohort import LocalData
from fedssl.fl.state import FederationConfig, FedState
from fedssl.methods.cpcfl.models import PoolModel
from fedssl.stage.runtime import numpy_rng
from fedssl.strategies.aggregation import fedavg, fedavg_by_group, stacked
from fedssl.strategies.base import Strategy

Tensors = dict[str, torch.Tensor]


class PoolStrategy(Strategy):
    """Alg. 2 on the engine's hooks (see the module docstring). ``data``: the clients' training
    data (each scores the pool on its own); ``pool``: the N initial model states; ``tests``:
    (test images on the device, labels, each client's test indices) for the evaluate hook, or
    None (the FedAvg warm-up is not evaluated)."""

    def __init__(
        self,
        cfg: FederationConfig,
        data: LocalData,
        c,
        pool: list[Tensors],
        net: PoolModel,
        attempt: int = 0,
        tests=None,
        true_groups: list[int] | None = None,
    ):
        super().__init__(cfg, data)
        self.c, self.pool0, self.net, self.attempt = c, pool, net, attempt
        self.tests, self.true_groups = tests, true_groups
        self.n = len(pool)
        self.heads = [k for k, _ in net.named_parameters() if k.startswith("head.")]
        self.encoder = [k for k in pool[0] if k.startswith("encoder.")]
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
        return state.round < self.c.explore_rounds

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

    def trainable(self, state) -> set[str] | None:
        return set(self.heads) if self.exploring(state) else None

    def upload(self, state, client, trained) -> Tensors:
        n_u = torch.tensor([self._choice[client]], dtype=torch.int64)
        state.ledger.sent(client, {"n_u": n_u}, "cluster_id")
        return trained

    # ---------------------------------------------------------------- server side
    def encoder_frozen(self, state) -> bool:
        """While exploring, and throughout with E_l,f = 0 (Tab. 7's frozen encoder)."""
        return self.exploring(state) or self.c.encoder_epochs == 0

    def aggregate(self, state, updates) -> None:
        # only what trained is averaged: a frozen encoder stays bit-identical (an average of
        # equal float tensors need not be exactly that tensor)
        keys = self.heads if self.encoder_frozen(state) else list(updates.uploads[0])
        pooled = fedavg_by_group(updates.uploads, updates.weights, updates.groups, keys)
        for n, avg in pooled.items():  # an empty cluster keeps its model
            state.server[f"pool{n}"] = {**self.model(state, n), **avg}
        if self.c.global_encoder and not self.encoder_frozen(state):
            shared = fedavg(stacked(updates.uploads, self.encoder), updates.weights)
            for n in range(self.n):
                state.server[f"pool{n}"] = {**self.model(state, n), **shared}
        memo = state.memo
        choice = memo.setdefault("last_choice", [-1] * state.num_clients)
        phase = "explore_rounds" if self.exploring(state) else "exploit_rounds"
        counts = memo.setdefault(phase, [0] * state.num_clients)
        for c, n in zip(updates.clients, updates.groups):
            choice[c] = int(n)
            counts[c] += 1

    def evaluate(self, state, round_) -> dict | None:
        choice = list(state.memo["last_choice"])
        out = {"clusters_used": len({n for n in choice if n >= 0})}
        if self.true_groups is not None and min(choice) >= 0:
            out["ari"] = round(adjusted_rand_index(choice, self.true_groups), 4)
        self._failure_rule(state, out["clusters_used"])
        if self.tests is None:
            return out
        accs, _, _ = self.outputs(state)
        return {**PersonalLog(state.memo).record(accs, choice), **out}

    def outputs(self, state):
        """Every client's cluster model on its own test split: (accuracy %, labels, probs)."""
        images, labels, tests = self.tests
        choice = state.memo["last_choice"]
        self.net.eval()
        return client_outputs(
            lambda c, x: functional_call(self.net, self.model(state, max(choice[c], 0)), (x,)),
            images,
            labels,
            tests,
        )

    def _failure_rule(self, state, used: int) -> None:
        """IFCA's clustering failure (spec §8.8): after T_c, every client on one model for
        ``patience`` rounds in a row, or in the last round."""
        if self.n == 1 or self.exploring(state):
            return
        memo = state.memo
        memo["streak"] = memo.get("streak", 0) + 1 if used == 1 else 0
        last = state.round + 1 == self.cfg.rounds
        if memo["streak"] >= self.c.patience or (last and used == 1):
            memo.setdefault("failed_at", state.round + 1)
