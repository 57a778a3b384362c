"""FeatARC's training (spec §5.2; imported when its step runs; costs: :mod:`.costs`).

The server keeps C cluster models (cluster 0 is the shared seeded initialisation, so C = 1 is
FedSimCLR's start; the others independent draws). Each round every client downloads all C
models and scores them on its own data: a_k = argmax_c mean_x <h_c(x), h_L(x)>, with h the
normalised backbone feature of un-augmented images (BN in eval mode) of cluster model c and of
the client's last trained model L_k (at first, cluster k mod C). The sampled clients train
SimCLR from G_{a_k} plus s·L_align, the pull of their features toward h_{a_k} of the same
images, computed by a frozen copy of G_{a_k}'s backbone (fixed for the round, as the authors'
bank). Each cluster model becomes the mean of its members' uploads; a cluster without members
keeps its weights. The encoder evaluated is the cluster model serving the most data (the spec's
|D|-weighted choice; the authors' code reports the best test accuracy over the C cluster models,
an oracle choice made on the test set, which is not reproduced).
The network is the project's SimCLR model (its head has no BN, the authors' has one after the
hidden layer), so C = 1, s = 0 is FedSimCLR with uniform FedAvg exactly.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedssl.data.augment import BatchAugment, multi_view, to_float
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig
from fedssl.fl.engine import (
    Federation,
    FedState,
    LocalTraining,
    RoundUpdates,
    Strategy,
    federation_config,
    model_state,
)
from fedssl.fl.runner import run_federation, train_data
from fedssl.losses import masked_mean, nt_xent
from fedssl.models.encoders import (
    ContrastiveModel,
    frozen,
    load_encoder,
    save_contrastive_model,
    seeded_contrastive_model,
)
from fedssl.precision import under_policy
from fedssl.runtime import derive_seed, torch_save
from fedssl.strategies.aggregation import fedavg_by_group

NET, ANCHOR, LAST = "net.", "anchor.", "last."


class FeatARCModel(nn.Module):
    """The trained SimCLR network and a frozen eval-mode copy of the round's cluster backbone
    (the alignment target)."""

    def __init__(self, net: ContrastiveModel):
        super().__init__()
        self.net = net
        self.anchor = frozen(copy.deepcopy(net.backbone))

    def forward(self, x, branch: str = "train"):
        """(projections, backbone features) of ``x``; ``branch`` "anchor": h(x)."""
        if branch == "anchor":
            return F.normalize(self.anchor(x).float(), dim=1)
        features = self.net.backbone(x)
        return self.net.head(features), features


def alignment_loss(targets: torch.Tensor, y1: torch.Tensor, y2: torch.Tensor, valid=None):
    """L_align = -(mean <h, normalize(y1)> + mean <h, normalize(y2)>) / 2, in [-1, 1]."""
    per_row = (targets * F.normalize(y1.float(), dim=1)).sum(1) + (
        targets * F.normalize(y2.float(), dim=1)
    ).sum(1)
    return masked_mean(-0.5 * per_row, valid)


def _branches(model, state, x, raw):
    """The projections and backbone features of the views ``x`` and the anchor's targets for
    the raw images (no gradient), in one precision region."""
    z, features = functional_call(model, state, (x,))
    with torch.no_grad():
        targets = functional_call(model, state, (raw,), {"branch": "anchor"})
    return z, features, targets


def featarc_loss(temperature: float, scale: float, align_space: str):
    def loss(model, params, buffers, batch):
        v1, v2, raw = batch.views
        x = torch.cat([v1, v2])
        z, features, targets = under_policy(x, _branches, model, (params, buffers), x, raw)
        z1, z2 = z.float().chunk(2)
        ssl = nt_xent(z1, z2, temperature, batch.valid)
        aligned = z if align_space == "proj_to_backbone" else features
        return ssl + scale * alignment_loss(targets, *aligned.float().chunk(2), batch.valid)

    return loss


def cluster_key(c: int) -> str:
    return f"cluster{c}"


class FeatARCStrategy(Strategy):
    def __init__(self, cfg, p, model: FeatARCModel):
        super().__init__(cfg)
        self.p, self.model = p, model
        self.backbone_keys = [k for k in model.state_dict() if k.startswith(NET + "backbone.")]

    def init_server(self, net: ContrastiveModel):
        """Cluster 0 from the shared seeded init (``net``), the others from their own seeds."""
        net = {NET + k: v for k, v in model_state(net).items()}
        server = {cluster_key(0): net}
        for c in range(1, self.p.clusters):
            torch.manual_seed(derive_seed(self.p.seed, "init", "featarc cluster", c))
            other = ContrastiveModel(self.p.model, self.fed.data.images.shape[1:])
            other.to(self.fed.data.device)
            server[cluster_key(c)] = {NET + k: v for k, v in model_state(other).items()}
        return server

    # ------------------------------------------------------------------ assignment
    def sample(self, state: FedState, round_: int) -> list[int]:
        """Assign every client to its cluster (the round's first work), then sample."""
        state.memo["assignment"] = [
            self.assign(state, k) for k in range(len(self.fed.data.clients))
        ]
        return super().sample(state, round_)

    def last_backbone(self, state: FedState, client: int):
        kept = state.clients.get(client)
        if kept is None:
            return state.server[cluster_key(client % self.p.clusters)]
        return {k[len(LAST) :]: v for k, v in kept.items()}

    @torch.no_grad()
    def features(self, weights, images: torch.Tensor) -> torch.Tensor:
        """normalize(f(x)) of un-augmented images under ``weights`` (BN in eval mode)."""
        backbone = {k[len(NET + "backbone.") :]: weights[k] for k in self.backbone_keys}
        out = [
            functional_call(self.model.anchor, backbone, (to_float(chunk),))
            for chunk in images.split(self.p.batch_size)
        ]
        return F.normalize(torch.cat(out).float(), dim=1)

    def scores(self, state: FedState, client: int) -> torch.Tensor:
        """mean_x <h_c(x), h_L(x)> for every cluster c on the client's data."""
        data = self.fed.data
        images = data.images[torch.as_tensor(data.clients[client]).to(data.device)]
        own = self.features(self.last_backbone(state, client), images)
        return torch.stack(
            [
                (self.features(state.server[cluster_key(c)], images) * own).sum(1).mean()
                for c in range(self.p.clusters)
            ]
        )

    def assign(self, state: FedState, client: int) -> int:
        return int(self.scores(state, client).argmax())

    def group(self, state: FedState, client: int) -> int:
        return state.memo["assignment"][client]

    # ------------------------------------------------------------------ exchange
    def download(self, state: FedState, client: int):
        """All C cluster models: the client scores each on its data."""
        return {
            f"{cluster_key(c)}.{k}": v
            for c in range(self.p.clusters)
            for k, v in state.server[cluster_key(c)].items()
        }

    def local_start(self, state: FedState, client: int, received):
        prefix = f"{cluster_key(self.group(state, client))}."
        start = {k[len(prefix) :]: v for k, v in received.items() if k.startswith(prefix)}
        anchor = {ANCHOR + k[len(NET + "backbone.") :]: start[k] for k in self.backbone_keys}
        return {**start, **anchor}

    def trainable(self, state):
        return {k for k, _ in self.model.named_parameters() if k.startswith(NET)}

    def upload(self, state: FedState, client: int, trained):
        return {k: v for k, v in trained.items() if k.startswith(NET)}

    def keep(self, state: FedState, client: int, trained):
        return {LAST + k: trained[k] for k in self.backbone_keys}

    def aggregate(self, state: FedState, updates: RoundUpdates) -> None:
        weights = updates.weights
        if self.p.weighting != "size":
            weights = torch.ones_like(weights)
        for c, avg in fedavg_by_group(updates.uploads, weights, updates.groups).items():
            state.server[cluster_key(c)] = avg  # no member this round: the model stays

    def evaluate(self, state: FedState, round_: int) -> dict:
        counts = [state.memo["assignment"].count(c) for c in range(self.p.clusters)]
        return {"clients_per_cluster": "/".join(map(str, counts))}

    def served(self, state: FedState) -> list[int]:
        """Training samples of the clients assigned to each cluster (last assignment)."""
        sizes = self.fed.data.sizes()
        return [
            sum(n for n, a in zip(sizes, state.memo["assignment"]) if a == c)
            for c in range(self.p.clusters)
        ]

    def final_model(self, state: FedState):
        served = self.served(state)
        best = served.index(max(served))
        return {k[len(NET) :]: v for k, v in state.server[cluster_key(best)].items()}


def make_federation(p, net: ContrastiveModel, data: LocalData, ckpt, fingerprint) -> Federation:
    model = FeatARCModel(net)
    if p.align_space == "proj_to_backbone" and p.model.proj_dim != net.backbone.out_dim:
        raise ValueError(
            f"method.align_space 'proj_to_backbone' needs model.proj_dim ({p.model.proj_dim}) "
            f"= the backbone's width ({net.backbone.out_dim}): use 'backbone_to_backbone'"
        )
    augment = BatchAugment(p.augment, data.images.shape[-1])
    two_views = multi_view(augment, views=2)

    def views(batch, generator):
        return (*two_views(batch, generator), to_float(batch))

    cohort = CohortTrainer(
        model,
        views,
        featarc_loss(p.temperature, p.align_scale, p.align_space),
        OptimizerConfig(kind="adam", weight_decay=p.weight_decay),
        batch_size=p.batch_size,
        local_epochs=p.local_epochs,
        parallel=False,  # the frozen anchor runs in eval mode; one client at a time
    )
    cfg = federation_config(p, p.seed)
    return Federation(
        FeatARCStrategy(cfg, p, model), LocalTraining(cohort), data, cfg, ckpt, fingerprint
    )


def pretrain(ctx) -> None:
    p = ctx.exp.method
    net = seeded_contrastive_model(p.model, ctx.image_shape, p.seed, ctx.device)
    fed = make_federation(p, net, train_data(ctx), ctx.resume_path, ctx.fingerprint)
    state = run_federation(ctx, fed, net)  # loads the cluster model serving the most data
    save_contrastive_model(net, ctx.out / "model.pt", ctx.image_shape)
    torch_save(
        {"clusters": state.server, "assignment": state.memo["assignment"]}, ctx.out / "clusters.pt"
    )
    ctx.info.update(served=fed.strategy.served(state), assignment=state.memo["assignment"])


def encoder(ctx):
    """The frozen backbone (or with ``projection`` backbone + head) of the evaluated cluster."""
    return load_encoder(
        ctx.exp.method.model,
        ctx.input("pretrain") / "model.pt",
        ctx.device,
        ctx.exp.features.layer == "projection",
    )
