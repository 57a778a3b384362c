"""CP-CFL's pool of N models (Alg. 2): the library's IFCA (:mod:`fedssl.strategies.ifca`:
the pool down, each client's choice n_u by its own loss or at random while t < T_c, FedAvg
within each cluster, IFCA's failure rule) with what CP-CFL adds:

* ``trainable``: the heads only while t < T_c (the encoder stays bit-identical);
* ``aggregate``: only what trained is averaged; optionally the encoder averaged over every
  client (global encoder);
* ``evaluate``: each client's accuracy on its own test split with its cluster's new model
  (:class:`fedssl.eval.personal.PersonalLog`), ARI of the choices.

FedAvg is the pool of one.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from fedssl.eval.metrics import adjusted_rand_index
from fedssl.eval.personal import PersonalLog, client_outputs
from fedssl.fl.cohort import LocalData
from fedssl.fl.state import FederationConfig
from fedssl.methods.cpcfl.models import PoolModel
from fedssl.strategies.aggregation import fedavg, stacked
from fedssl.strategies.ifca import IFCA

Tensors = dict[str, torch.Tensor]


class PoolStrategy(IFCA):
    """Alg. 2 on the engine's hooks (see the module docstring). ``data``: the clients' training
    data (each scores the pool on its own); ``c``: the federation settings
    (``method.federation``); ``pool``: the N initial model states; ``tests``: (test images on
    the device, labels, each client's test indices) for the evaluate hook, or None (the FedAvg
    warm-up is not evaluated)."""

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
        super().__init__(cfg, data, pool, net, c, attempt)
        self.c, self.tests, self.true_groups = c, tests, true_groups
        self.heads = [k for k, _ in net.named_parameters() if k.startswith("head.")]
        self.encoder = [k for k in pool[0] if k.startswith("encoder.")]

    def trainable(self, state) -> set[str] | None:
        return set(self.heads) if self.exploring(state) else None

    def encoder_frozen(self, state) -> bool:
        """While exploring, and throughout with E_l,f = 0 (Tab. 7's frozen encoder)."""
        return self.exploring(state) or self.c.encoder_epochs == 0

    def aggregate(self, state, updates) -> None:
        # only what trained is averaged: a frozen encoder stays bit-identical (an average of
        # equal float tensors need not be exactly that tensor)
        keys = self.heads if self.encoder_frozen(state) else list(updates.uploads[0])
        self.average_within_clusters(state, updates, keys)
        if self.c.global_encoder and not self.encoder_frozen(state):
            shared = fedavg(stacked(updates.uploads, self.encoder), updates.weights)
            for n in range(self.n):
                state.server[f"pool{n}"] = {**self.model(state, n), **shared}
        self.record_choices(state, updates)

    def evaluate(self, state, round_) -> dict | None:
        out = super().evaluate(state, round_)
        choice = list(state.memo["last_choice"])
        if self.true_groups is not None and min(choice) >= 0:
            out["ari"] = round(adjusted_rand_index(choice, self.true_groups), 4)
        if self.tests is None:
            return out
        accs, _, _ = self.outputs(state)
        return {**PersonalLog(state.memo).record(accs, choice), **out}

    def outputs(self, state):
        """Every client's cluster model on its own test split: (accuracy %, labels, probs)."""
        return client_outputs(self.scorer(state), *self.tests)

    def scorer(self, state):
        """``logits_of(client, images)``: each client's cluster model now, in eval mode."""
        choice = state.memo["last_choice"]
        self.net.eval()
        return lambda c, x: functional_call(self.net, self.model(state, max(choice[c], 0)), (x,))
