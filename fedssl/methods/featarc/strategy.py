"""FeatARC's clustering (spec §5.2): C cluster models on the server, each client joining the
one whose features align best with its own last model's.

Cluster 0 is the shared seeded initialisation (so C = 1 is FedSimCLR's start; the others are
independent draws). Each round every client downloads all C models and scores them on its own
data: a_k = argmax_c mean_x <h_c(x), h_L(x)>, with h the normalised backbone feature of
un-augmented images (BN in eval mode) of cluster model c and of the client's last trained model
L_k (at first, cluster k mod C). The sampled clients train from G_{a_k}, aligned to it (see
:mod:`.model`); each cluster model becomes the mean of its members' uploads, and a cluster
without members keeps its weights. The encoder evaluated is the cluster model serving the most
data (the spec's |D|-weighted choice; the authors' code reports the best test accuracy over
the C cluster models, an oracle choice made on the test set, which is not reproduced).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedssl.data.augment import to_float
from fedssl.fl.cohort import LocalData
from fedssl.fl.state import FedState, RoundUpdates, model_state
from fedssl.methods.featarc.model import FeatARCModel
from fedssl.models.encoders import ContrastiveModel
from fedssl.stage.runtime import derive_seed, torch_save
from fedssl.strategies.aggregation import fedavg_by_group
from fedssl.strategies.base import Strategy

if TYPE_CHECKING:
    from fedssl.rounds.recipe import FinishedRun

NET, ANCHOR, LAST = "net.", "anchor.", "last."


def cluster_key(c: int) -> str:
    return f"cluster{c}"


class FeatARCStrategy(Strategy):
    def __init__(self, cfg, model: FeatARCModel, p, data: LocalData):
        super().__init__(cfg, data)
        self.p, self.model = p, model
        self.backbone_keys = [k for k in model.state_dict() if k.startswith(NET + "backbone.")]

    def init_server(self, model: FeatARCModel):
        """Cluster 0 from the shared seeded init, the others from their own seeds."""
        net = {NET + k: v for k, v in model_state(model.net).items()}
        server = {cluster_key(0): net}
        for c in range(1, self.p.clusters):
            torch.manual_seed(derive_seed(self.p.seed, "init", "featarc cluster", c))
            other = ContrastiveModel(self.p.model, self.data.images.shape[1:])
            other.to(self.data.device)
            server[cluster_key(c)] = {NET + k: v for k, v in model_state(other).items()}
        return server

    # ------------------------------------------------------------------ assignment
    def sample(self, state: FedState, round_: int) -> list[int]:
        """Assign every client to its cluster (the round's first work), then sample."""
        state.memo["assignment"] = [self.assign(state, k) for k in range(state.num_clients)]
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
            for chunk in images.split(self.p.federation.batch_size)
        ]
        return F.normalize(torch.cat(out).float(), dim=1)

    def scores(self, state: FedState, client: int) -> torch.Tensor:
        """mean_x <h_c(x), h_L(x)> for every cluster c on the client's data."""
        data = self.data
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
        return self.anchored(start)

    def anchored(self, net):
        """The cluster model ``net`` (``net.*`` weights) with its backbone as the anchor."""
        anchor = {ANCHOR + k[len(NET + "backbone.") :]: net[k] for k in self.backbone_keys}
        return {**net, **anchor}

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
        sizes = self.data.sizes()
        return [
            sum(n for n, a in zip(sizes, state.memo["assignment"]) if a == c)
            for c in range(self.p.clusters)
        ]

    def final_model(self, state: FedState):
        """The cluster model serving the most data (anchored to itself)."""
        served = self.served(state)
        return self.anchored(state.server[cluster_key(served.index(max(served)))])


def save_clusters(run: FinishedRun) -> dict:
    """Every cluster model and the last assignment (``clusters.pt``) beside the evaluated one."""
    state = run.state
    assignment = state.memo["assignment"]
    torch_save({"clusters": state.server, "assignment": assignment}, run.ctx.out / "clusters.pt")
    return {"served": run.strategy.served(state), "assignment": assignment}
