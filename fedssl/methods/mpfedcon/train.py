"""MpFedcon and its baselines on the engine's hooks (imported when the ``train`` step runs).

:class:`SplitStrategy` is the layered network's protocol: the server holds the shared layers
(and, for MpFedcon, the global class centres); a sampled party downloads them, starts from them
and the layers it kept (its personal head), trains in one or two phases (head first, then body:
:class:`~fedssl.rounds.loop.Phase`), uploads its shared layers (and its class centres with their
counts) and keeps the rest. Every round the strategy's ``evaluate`` hook scores every party's
own model on its own test split (:mod:`fedssl.eval.personal`). Per-party state lives in
``FedState.clients``, so the engine's checkpoint resumes a run exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedssl.attacks.leakage import add_gradient_noise
from fedssl.data import to_device
from fedssl.data.augment import to_float
from fedssl.eval.personal import PersonalLog, client_outputs, evaluated_round
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig, forward
from fedssl.fl.state import FederationConfig, FedState, RoundUpdates
from fedssl.losses import masked_cross_entropy, model_contrastive_loss
from fedssl.methods.mpfedcon.nets import Anchored, layer_of, net_keys, part
from fedssl.models.cnn import LayeredNet
from fedssl.models.heads import ProjectionHead
from fedssl.stage.runtime import derive_seed, torch_generator
from fedssl.strategies.aggregation import fedavg, stacked
from fedssl.strategies.base import Strategy

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext

CENTRE_KEYS = ("centres", "has_centre")  # what the server sends: the bank and which rows hold
ALIVE_BATCH = 128  # images per party for the alive-unit diagnostic (one forward)


# ------------------------------------------------------------------ losses
def _masked_ce(logits: torch.Tensor, batch) -> torch.Tensor:
    return masked_cross_entropy(logits, batch.labels, batch.valid)


def _forward(model, params, buffers, batch, *args):
    """The party's network on the batch's training view, under the precision policy."""
    return forward(model, (params, buffers), batch.views[0], *args)


def ce_loss():
    """Cross-entropy of the party's network (the head phase, and most baselines)."""

    def loss(model, params, buffers, batch):
        logits, _, _ = _forward(model, params, buffers, batch)
        return _masked_ce(logits, batch)

    return loss


def contrast_loss(mu: float, temperature: float):
    """MpFedcon's body phase (Eq. 6): CE + mu * l_con(z, c[y], z_con) (Eq. 5), where z = P(D(x))
    of the party's live network, c[y] the global centre of the sample's class and z_con the
    anchor's projection. Rows whose class has no centre yet are left out of l_con (A4)."""

    def loss(model, params, buffers, batch):
        logits, z, z_con = _forward(model, params, buffers, batch, True)
        y = batch.labels.clamp(min=0)
        has = buffers["has_centre"][y] > 0
        l_con = model_contrastive_loss(
            z, buffers["centres"][y], z_con, temperature, batch.valid & has
        )
        return _masked_ce(logits, batch) + mu * l_con

    return loss


# ------------------------------------------------------------------ evaluation data
@dataclass
class TestData:
    """The test split on the device and each party's test indices into it."""

    images: torch.Tensor
    labels: torch.Tensor
    clients: list[np.ndarray]


def test_data(ctx: StepContext) -> TestData:
    images, labels = ctx.split("test")
    return TestData(
        to_device(images, ctx.device),
        torch.as_tensor(np.asarray(labels), dtype=torch.int64).to(ctx.device),
        ctx.client_tests(),
    )


# ------------------------------------------------------------------ diagnostics
@torch.no_grad()
def alive_fractions(net: LayeredNet, weights: dict, data: LocalData, idx) -> dict:
    """Of the network ``weights`` (keys without ``net.``) on images ``idx`` of ``data``: the
    fraction of D's output units (ReLU) and of P's hidden units (its pre-activation; absent
    without a projection head) that are positive for at least one image."""
    h = functional_call(net.base, part(weights, "base"), (to_float(data.images[idx]),))
    out = {"alive_base": float((h > 0).any(0).float().mean())}
    if isinstance(net.projector, ProjectionHead):
        hidden = functional_call(net.projector[0], part(weights, "projector.0"), (h,))
        out["alive_head"] = float((hidden > 0).any(0).float().mean())
    return out


# ------------------------------------------------------------------ the protocol
class SplitStrategy(Strategy):
    """Shared layers averaged, personal layers kept; optional class centres (MpFedcon)."""

    def __init__(
        self, cfg: FederationConfig, p, model: Anchored, tests: TestData, data: LocalData | None
    ):
        super().__init__(cfg, data)
        self.p, self.model, self.tests = p, model, tests
        self.keys = net_keys(model)
        self.shared = [k for k in self.keys if layer_of(k) in p.shared_layers]
        self.personal = [k for k in self.keys if k not in self.shared]
        names = {k for k, _ in model.named_parameters()}
        self.shared_params = {k for k in self.shared if k in names}
        self.personal_params = {k for k in self.personal if k in names}
        self.net_params = dict.fromkeys(k for k in self.keys if k in names).keys()  # ordered
        self.centres = p.variant == "mpfedcon"
        self.prev = self.centres and p.neg_source == "prev_local"

    # -------------------------------------------------------------- server side
    def init_server(self, model: Anchored) -> dict:
        state = model.state_dict()
        return {
            "global": {k: state[k].detach().clone() for k in self.keys},
            "centres": {k: state[k].detach().clone() for k in CENTRE_KEYS},
        }

    def download(self, state: FedState, client: int) -> dict:
        sent = {k: state.server["global"][k] for k in self.shared}
        if self.centres:
            sent.update(state.server["centres"])
        return sent

    def traffic(self, tensors: dict) -> dict[str, dict]:
        kinds: dict[str, dict] = {}
        for k, v in tensors.items():
            centre = k.startswith("centre") or k == "has_centre"
            kinds.setdefault("centres" if centre else "model", {})[k] = v
        return kinds

    def local_start(self, state: FedState, client: int, received: dict) -> dict:
        kept, glob = state.clients.get(client, {}), state.server["global"]
        net = {k: received[k] if k in self.shared else kept.get(k, glob[k]) for k in self.keys}
        # the anchor: the model this round starts from (A2), or the party's previous model
        anchor = {k: kept.get("prev." + k, v) if self.prev else v for k, v in net.items()}
        bank = received if self.centres else state.server["centres"]
        return {
            **net,
            **{"anchor." + k[len("net.") :]: v for k, v in anchor.items()},
            **{k: bank[k] for k in CENTRE_KEYS},
        }

    def upload(self, state: FedState, client: int, trained: dict) -> dict:
        out = {k: trained[k] for k in self.shared}
        noise = self.p.upload_noise
        if noise is not None and out:
            out = add_gradient_noise(
                out,
                noise.kind,
                noise.variance,
                derive_seed(self.p.seed, "upload-noise", state.round, client),
            )
        if self.centres:
            out.update(self.local_centres(client, trained))
        return out

    def keep(self, state: FedState, client: int, trained: dict) -> dict | None:
        kept = {k: trained[k] for k in self.personal}
        if self.prev:
            kept.update({"prev." + k: trained[k] for k in self.shared})
        return kept or None

    def aggregate(self, state: FedState, updates: RoundUpdates) -> None:
        if self.shared:
            avg = fedavg(stacked(updates.uploads, self.shared), updates.weights)
            state.server["global"] = {**state.server["global"], **avg}
        if self.centres:
            self.aggregate_centres(state, updates.uploads)

    # -------------------------------------------------------------- class centres
    @torch.no_grad()
    def local_centres(self, client: int, trained: dict) -> dict:
        """Eq. 3 after local training: the mean projection P(D(x)) of each class the party
        holds (no augmentation), with the class ids and sample counts m_k (SUG, for A5)."""
        data = self.data
        idx = torch.as_tensor(data.clients[client], device=data.device)
        _, z, _ = functional_call(self.model, trained, (to_float(data.images[idx]),))
        y = data.labels[idx]
        classes, counts = torch.unique(y, return_counts=True)
        sums = torch.zeros(len(classes), z.shape[1], device=z.device).index_add_(
            0, torch.searchsorted(classes, y), z.float()
        )
        return {
            "centres": sums / counts[:, None],
            "centre_classes": classes,
            "centre_counts": counts,
        }

    def aggregate_centres(self, state: FedState, uploads: list[dict]) -> None:
        """Eq. 4 per class over the parties of the round that hold it, weighted by their m_k
        (A5); classes no party of the round holds keep their last centre (A4)."""
        bank = state.server["centres"]
        sums = torch.zeros_like(bank["centres"], dtype=torch.float64)
        mass = torch.zeros(len(sums), dtype=torch.float64, device=sums.device)
        for u in uploads:
            m = u["centre_counts"].double()
            sums.index_add_(0, u["centre_classes"], u["centres"].double() * m[:, None])
            mass.index_add_(0, u["centre_classes"], m)
        held = mass > 0
        centres = bank["centres"].clone()
        centres[held] = (sums[held] / mass[held, None]).to(centres.dtype)
        state.server["centres"] = {
            "centres": centres,
            "has_centre": torch.maximum(bank["has_centre"], held.to(centres.dtype)),
        }

    # -------------------------------------------------------------- personalised evaluation
    def party_state(self, state: FedState, client: int) -> dict:
        """A party's network now: the server's shared layers, its own (or the initial) rest."""
        kept, glob = state.clients.get(client, {}), state.server["global"]
        return {
            k[len("net.") :]: kept.get(k, glob[k]) if k in self.personal else glob[k]
            for k in self.keys
        }

    def outputs(self, state: FedState, round_: int):
        """Every party's accuracy (%), labels and softmax outputs on its own test split."""
        t = self.tests
        return client_outputs(self.scorer(state, round_), t.images, t.labels, t.clients)

    def scorer(self, state: FedState, round_: int):
        """``logits_of(party, images)``: each party's model at ``round_`` (FedAvg+FT's heads
        fine-tuned once here, whatever images they then score)."""
        if self.p.variant == "fedavg_ft":
            heads, features = self.finetuned_heads(state, round_)
            return lambda c, x: functional_call(
                heads.model, {k: v[c] for k, v in heads.states.items()}, (features(x),)
            )
        parties = [self.party_state(state, c) for c in range(len(self.tests.clients))]
        net = self.model.net
        return lambda c, x: functional_call(net, parties[c], (x,))

    def final_model(self, state: FedState) -> dict:
        """A complete state of the wrapper: the global network (anchor = it, the centres)."""
        glob = state.server["global"]
        return {
            **glob,
            **{"anchor." + k[len("net.") :]: v for k, v in glob.items()},
            **state.server["centres"],
        }

    def evaluate(self, state: FedState, round_: int) -> dict:
        """Every party's personal accuracy and its ReLUs alive, on the rounds
        ``personal_every`` evaluates (:func:`evaluated_round`; nothing else reads them)."""
        if not evaluated_round(round_, self.p.federation.rounds, self.p.personal_every):
            return {}
        accs, _, _ = self.outputs(state, round_)
        log = PersonalLog(state.memo).record(accs, number=round_ + 1)
        return {**log, **self.alive_units(state)}

    def alive_units(self, state: FedState) -> dict:
        """The round log's view of dying ReLUs: per party, on up to ``ALIVE_BATCH`` of its
        training images (stored order, no augmentation), the fraction of units that fire on
        at least one image, in D's output layer and in P's hidden layer; mean over parties.
        Reads the parties' networks only: no random draw, no training state touched."""
        data, rows = self.data, []
        for c in range(len(data.clients)):
            idx = torch.as_tensor(data.clients[c][:ALIVE_BATCH], device=data.device)
            rows.append(alive_fractions(self.model.net, self.party_state(state, c), data, idx))
        return {k: round(float(np.mean([r[k] for r in rows])), 4) for k in rows[0]}

    def finetuned_heads(self, state: FedState, round_: int):
        """FedAvg+FT: every party fine-tunes the global model's head (P+O, or O) on its own
        training data (no augmentation) for ``finetune_epochs``, from the same start; the layers
        below stay frozen, so their features are computed once."""
        p, glob, net = self.p, state.server["global"], self.model.net
        top = ["projector", "output"] if p.finetune_layers == "head" else ["output"]
        head = nn.Sequential(*[getattr(net, name) for name in top])
        below = [name for name in ("base", "projector", "output") if name not in top]
        params = {k[len("net.") :]: v for k, v in glob.items()}
        features = _features_below(net, below, params)
        data = self.data
        local = _party_features(features, data)
        start = {
            f"{i}.{k[len(name) + 1 :]}": v
            for i, name in enumerate(top)
            for k, v in params.items()
            if k.startswith(name + ".")
        }
        trainer = CohortTrainer(
            head,
            lambda b, g: (b,),
            _head_ce,
            OptimizerConfig("sgd", p.federation.weight_decay, p.federation.momentum),
            p.federation.batch_size,
            p.finetune_epochs,
            parallel=True,
        )
        n = len(data.clients)
        trained, _ = trainer.train(
            [start] * n,
            local,
            list(range(n)),
            p.federation.lr,
            (p.seed, "finetune", round_),
            torch_generator(data.device, p.seed, "finetune", round_),
        )
        return _Heads(head, trained), features


def _features_below(net: nn.Module, below: list[str], params: dict[str, torch.Tensor]):
    """The frozen layers ``below`` the head under the global weights ``params``: x -> their
    features."""

    @torch.no_grad()
    def features(x: torch.Tensor) -> torch.Tensor:
        for name in below:
            module = getattr(net, name)
            x = functional_call(
                module,
                {k[len(name) + 1 :]: v for k, v in params.items() if k.startswith(name + ".")},
                (x,),
            )
        return x

    return features


def _party_features(features, data) -> LocalData:
    """Every party's training images through ``features`` (1024 at a time), in party order,
    with their labels: the heads' local data."""
    sizes = [len(c) for c in data.clients]
    order = torch.as_tensor(np.concatenate(data.clients), device=data.device)
    feats = torch.cat(
        [features(to_float(data.images[order[s : s + 1024]])) for s in range(0, len(order), 1024)]
    )
    bounds = np.cumsum([0, *sizes])
    return LocalData(
        feats, data.labels[order], [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    )


@dataclass
class _Heads:
    model: nn.Module
    states: dict


def _head_ce(model, params, buffers, batch):
    return _masked_ce(_forward(model, params, buffers, batch), batch)
