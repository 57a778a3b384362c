"""Orchestra's training (spec §4.3; imported when its step runs; costs: :mod:`.costs`).

Round 0 trains nothing: each client fills its memory with target projections and clusters it,
and the server clusters the local centroids into the first global centroids. Every later round
the clients train the clustering loss (teacher: the target's assignment of view 1; student:
the online assignment of view 2) plus rotation prediction, push the teacher's projections into
their memory, cluster it, and upload the model with their local centroids; the server averages
the model and re-clusters the global centroids. The memory stays on the client across rounds.

One deviation from the authors' loop: the target's EMA runs after each optimiser step (the
shared :func:`fedssl.fl.momentum.ema_after_step`) instead of before each forward, so a round's
EMA sees the weights after steps 1..K where the authors' sees those after steps 0..K-1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedssl.data.augment import BatchAugment
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig
from fedssl.fl.engine import (
    Federation,
    FederationConfig,
    FedState,
    LocalTraining,
    Phase,
    RoundUpdates,
    Strategy,
    fedavg,
    model_state,
    stacked,
)
from fedssl.fl.momentum import ema_after_step
from fedssl.fl.runner import run_federation, train_data
from fedssl.losses import masked_cross_entropy, masked_mean
from fedssl.methods.orchestra.clustering import global_clustering, local_clustering
from fedssl.methods.orchestra.model import (
    CENTROIDS,
    MEMORY,
    OrchestraModel,
    orchestra_views,
    seeded_orchestra_model,
)
from fedssl.models.encoders import frozen
from fedssl.precision import under_policy
from fedssl.runtime import numpy_rng, torch_generator, torch_save

LOCAL_CENTROIDS = "local_centroids"


def clustering_loss(student: torch.Tensor, teacher: torch.Tensor, centroids, temperature, valid):
    """-Σ_j q_j log p_j, batch mean: q = softmax(teacher·Cᵀ/T) (no gradient), p the same of
    the normalised student projection; one direction only, as the authors' code."""
    q = F.softmax(teacher.detach().float() @ centroids.T / temperature, dim=1)
    log_p = F.log_softmax(F.normalize(student.float(), dim=1) @ centroids.T / temperature, dim=1)
    return masked_mean(-(q * log_p).sum(1), valid)


def _branches(model, state, x1, x2, x3):
    """The student's projection of x2, the rotation head's logits on x3 and the teacher's
    projection of x1 (no gradient, fp32): one precision region, the online weights' bf16 casts
    shared by the student and rotation branches."""
    student = functional_call(model, state, (x2,))
    rotation = functional_call(model, state, (x3,), {"branch": "rotation"})
    with torch.no_grad():
        teacher = functional_call(model, state, (x1,), {"branch": "target"}).float()
    return student, rotation, teacher


def orchestra_loss(temperature: float):
    """The local objective L_clu + L_deg. Side effect, like BatchNorm's running statistics: the
    batch's teacher projections are pushed into the client's memory buffer (FIFO)."""

    def loss(model, params, buffers, batch):
        x1, x2, x3, turns = batch.views
        student, rotation, teacher = under_policy(
            x1, _branches, model, (params, buffers), x1, x2, x3
        )
        centroids = buffers[CENTROIDS].float()
        l_clu = clustering_loss(student, teacher, centroids, temperature, batch.valid)
        l_deg = masked_cross_entropy(rotation, turns, batch.valid)
        with torch.no_grad():
            memory = buffers[MEMORY]
            memory.copy_(torch.cat([memory, teacher[batch.valid].to(memory.dtype)])[-len(memory) :])
        return l_clu + l_deg

    return loss


class OrchestraStrategy(Strategy):
    """Stateless clients as in the authors' code (online, target, rotation head and global
    centroids come from the server) that keep only their memory; FedAvg by data size, then
    global clustering of the uploaded local centroids."""

    def __init__(self, cfg: FederationConfig, p, model: OrchestraModel, view: BatchAugment):
        super().__init__(cfg)
        self.p, self.model, self.view = p, model, view
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
        return min(self.p.memory_size, len(self.fed.data.clients[client]))

    @torch.no_grad()
    def first_memory(self, received, client: int) -> torch.Tensor:
        """The target projections of view 1 of the client's first m_k samples, in training-mode
        BN whose statistics are then discarded, repeated to fill the m rows."""
        data, p = self.fed.data, self.p
        rows = torch.as_tensor(data.clients[client][: self.memory_rows(client)]).to(data.device)
        gen = torch_generator(data.device, self.cfg.seed, "memory", client)
        buffers = {
            k: v.clone() for k, v in received.items() if k in dict(self.model.named_buffers())
        }
        buffers[MEMORY] = self.model.memory
        weights = {k: v for k, v in received.items() if k not in buffers}
        parts = []
        for batch in rows.split(p.batch_size):
            x = self.view(data.images[batch], gen)
            parts.append(
                functional_call(self.model, (weights, buffers), (x,), {"branch": "target"})
            )
        found = torch.cat(parts).float()
        return found.repeat(math.ceil(p.memory_size / len(found)), 1)[: p.memory_size]


def make_federation(p, model: OrchestraModel, data: LocalData, ckpt, fingerprint) -> Federation:
    size = data.images.shape[-1]
    augment, prime = BatchAugment(p.augment, size), BatchAugment(p.augment_prime, size)
    cohort = CohortTrainer(
        model,
        orchestra_views(augment, prime),
        orchestra_loss(p.temperature),
        OptimizerConfig(kind="sgd", weight_decay=p.weight_decay, momentum=p.momentum),
        batch_size=p.batch_size,
        local_epochs=p.local_epochs,
        parallel=False,  # BatchNorm in the projector, and the memory write needs one client
        after_step=ema_after_step(model.target_pairs(), p.target_momentum),
    )
    # round 0 is the clustering-only initialisation: R + 1 rounds in all
    cfg = FederationConfig(p.rounds + 1, p.client_fraction, p.lr, "constant", p.seed)
    strategy = OrchestraStrategy(cfg, p, model, augment)
    training = LocalTraining(phases=lambda state: [Phase(cohort)] if state.round else [])
    return Federation(strategy, training, data, cfg, ckpt, fingerprint)


def pretrain(ctx) -> None:
    p = ctx.exp.method
    model = seeded_orchestra_model(p, ctx.image_shape, ctx.device)
    fed = make_federation(p, model, train_data(ctx), ctx.resume_path, ctx.fingerprint)
    run_federation(ctx, fed, model)
    torch_save(
        {"model": model.state_dict(), "image_shape": tuple(ctx.image_shape)}, ctx.out / "model.pt"
    )
    ctx.info["parameters"] = sum(q.numel() for q in model.parameters())


def load_model(p, path, device) -> OrchestraModel:
    ckpt = torch.load(path, map_location=device, weights_only=True)
    model = seeded_orchestra_model(p, ckpt["image_shape"], device)
    model.load_state_dict(ckpt["model"])
    return model


def encoder(ctx):
    """The frozen global online backbone the probes read (with ``projection``: and projector)."""
    model = load_model(ctx.exp.method, ctx.input("pretrain") / "model.pt", ctx.device)
    if ctx.exp.features.layer == "projection":
        return frozen(torch.nn.Sequential(model.backbone, model.projector))
    return frozen(model.backbone)


def encoder_module(method, image_shape, projection: bool = False):
    """The untrained module :func:`encoder` returns (what :mod:`fedssl.export` loads into)."""
    model = OrchestraModel(method, image_shape)
    return frozen(
        torch.nn.Sequential(model.backbone, model.projector) if projection else model.backbone
    )
