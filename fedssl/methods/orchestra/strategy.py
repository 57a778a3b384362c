"""Orchestra's federation (spec §4.3): stateless clients as in the authors' code (online
network, target, rotation head and global centroids come from the server) that keep only their
memory of target projections. Round 0 (the runtime's setup round) trains nothing: each client
fills its memory and clusters it, and the server clusters the local centroids into the first
global centroids. Every later round the clients train, push the teacher's projections into
their memory, cluster it and upload the model with their local centroids; the server averages
the model and re-clusters the global centroids.

One deviation from the authors' loop: the target's EMA runs after each optimiser step (the
shared :func:`fedssl.models.momentum.ema_after_step`) instead of before each forward, so a round's
EMA sees the weights after steps 1..K where the authors' sees those after steps 0..K-1.
"""

from __future__ import annotations

import math

import torch
from torch.func import functional_call

from fedssl.data.augment import BatchAugment
from fedssl.fl.cohort import LocalData
from fedssl.fl.state import FederationConfig, FedState, RoundUpdates, model_state
from fedssl.methods.orchestra.clustering import global_clustering, local_clustering
from fedssl.methods.orchestra.model import CENTROIDS, MEMORY, OrchestraModel
from fedssl.stage.runtime import numpy_rng, torch_generator
from fedssl.strategies.aggregation import fedavg, stacked
from fedssl.strategies.base import Strategy
from fedssl.training.epochs import train_mode_batches

LOCAL_CENTROIDS = "local_centroids"


class OrchestraStrategy(Strategy):
    """Stateless clients as in the authors' code (online, target, rotation head and global
    centroids come from the server) that keep only their memory; FedAvg by data size, then
    global clustering of the uploaded local centroids."""

    def __init__(self, cfg: FederationConfig, model: OrchestraModel, p, data: LocalData):
        super().__init__(cfg, data)
        self.p, self.model = p, model
        self.online = set(model.online_names())

    def init_server(self, model):
        return {"global": {k: v for k, v in model_state(model).items() if k != MEMORY}}

    def local_start(self, state: FedState, client: int, received):
        kept = state.clients.get(client) or {MEMORY: self.first_memory(received, client)}
        return {**received, **kept}

    def trainable(self, state):
        return self.online

    def traffic(self, tensors):
        kinds = {
            "model": {k: v for k, v in tensors.items() if k not in (CENTROIDS, LOCAL_CENTROIDS)}
        }
        kinds["centroids"] = {k: tensors[k] for k in (CENTROIDS, LOCAL_CENTROIDS) if k in tensors}
        return kinds

    def upload(self, state: FedState, client: int, trained):
        model = {k: v for k, v in trained.items() if k != MEMORY}
        memory = trained[MEMORY][-self.memory_rows(client) :]
        rng = numpy_rng(self.cfg.seed, "local_clustering", state.round, client)
        clusters = min(self.p.local_clusters, len(memory))
        return {**model, LOCAL_CENTROIDS: local_clustering(memory.float(), clusters, rng)}

    def keep(self, state: FedState, client: int, trained):
        return {MEMORY: trained[MEMORY]}

    def aggregate(self, state: FedState, updates: RoundUpdates) -> None:
        """FedAvg of the model by data size; the global centroids, which no client changes,
        are not averaged but re-clustered from the union of the local centroids."""
        keys = [k for k in updates.uploads[0] if k not in (CENTROIDS, LOCAL_CENTROIDS)]
        new = fedavg(stacked(updates.uploads, keys), updates.weights)
        local = torch.cat([u[LOCAL_CENTROIDS] for u in updates.uploads])
        new[CENTROIDS] = global_clustering(
            local, state.server["global"][CENTROIDS], self.p.temperature
        )
        state.server["global"] = new

    def final_model(self, state: FedState):
        return {**state.server["global"], MEMORY: torch.zeros_like(self.model.memory)}

    # ------------------------------------------------------------------ the client's memory
    def memory_rows(self, client: int) -> int:
        """m_k = min(m, n_k): a client smaller than the memory clusters its own samples once."""
        return min(self.p.memory_size, len(self.data.clients[client]))

    @torch.no_grad()
    def first_memory(self, received, client: int) -> torch.Tensor:
        """The target projections of view 1 of the client's first m_k samples, in training-mode
        BN whose statistics are then discarded, repeated to fill the m rows."""
        data, p = self.data, self.p
        rows = torch.as_tensor(data.clients[client][: self.memory_rows(client)]).to(data.device)
        gen = torch_generator(data.device, self.cfg.seed, "memory", client)
        view = BatchAugment(p.augment, data.images.shape[-1])  # A, as view 1 of training
        buffers = {
            k: v.clone() for k, v in received.items() if k in dict(self.model.named_buffers())
        }
        buffers[MEMORY] = self.model.memory
        weights = {k: v for k, v in received.items() if k not in buffers}
        parts = []
        for batch in train_mode_batches(rows, p.federation.batch_size):
            x = view(data.images[batch], gen)
            parts.append(
                functional_call(self.model, (weights, buffers), (x,), {"branch": "target"})
            )
        found = torch.cat(parts).float()
        return found.repeat(math.ceil(p.memory_size / len(found)), 1)[: p.memory_size]
