"""The personalised baselines of MpFedcon's Tab. 1 (spec methods/baselines.md §8-11) on the
layered network: the library's SCAFFOLD, APFL, Ditto and Per-FedAvg
(:mod:`fedssl.strategies`) bound to :class:`~fedssl.methods.mpfedcon.train.SplitStrategy` with
every layer shared, the network's ``net.*`` keys and its companion network (the personal model
v of APFL / Ditto, or SCAFFOLD's step correction c − c_i, beside ``net`` in the same model).

Evaluation is the shared personalised one (every party's model on its own test split).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from fedssl.data.augment import to_float
from fedssl.eval.personal import client_outputs
from fedssl.fl.cohort import forward
from fedssl.losses import masked_cross_entropy
from fedssl.methods.mpfedcon.nets import Anchored, part
from fedssl.methods.mpfedcon.train import SplitStrategy, ce_loss
from fedssl.rounds.loop import Phase
from fedssl.stage.runtime import numpy_rng
from fedssl.strategies import apfl, perfedavg
from fedssl.strategies.ditto import ditto_prox
from fedssl.strategies.personal import PersonalModel
from fedssl.strategies.scaffold import Scaffold, corrected

COMPANION = {"scaffold": "correction", "apfl": "personal", "ditto": "personal"}


class Companioned(Anchored):
    """:class:`Anchored` plus a second network of the same shape under ``name`` (the personal
    model v of APFL / Ditto, or SCAFFOLD's step correction c − c_i) and APFL's ``alpha``."""

    def __init__(self, net: nn.Module, num_classes: int, name: str, alpha: float | None = None):
        super().__init__(net, num_classes)
        self.add_module(name, copy.deepcopy(net))
        if alpha is not None:
            self.alpha = nn.Parameter(torch.tensor(float(alpha)))


def with_companion(p, model: Anchored) -> Anchored:
    """The variant's model: ``model`` as it is, or with the companion network it needs."""
    if p.variant not in COMPANION:
        return model
    alpha = p.apfl_alpha if p.variant == "apfl" else None
    out = Companioned(model.net, model.centres.shape[0], COMPANION[p.variant], alpha)
    return out.to(model.centres.device)


def _ce(net: nn.Module, weights: dict, x: torch.Tensor, labels, valid) -> torch.Tensor:
    return masked_cross_entropy(forward(net, weights, x), labels, valid)


def _net_ce(model, weights: dict, x, labels, valid) -> torch.Tensor:
    """The loss of the party's network ``model.net`` with ``weights``."""
    return _ce(model.net, weights, x, labels, valid)


# ------------------------------------------------------------------ SCAFFOLD
def scaffold_loss():
    """CE + <w, sg(c − c_i)>: its gradient is the corrected g − c_i + c of SCAFFOLD; c − c_i
    lives in the companion network ``correction``."""
    base = ce_loss()

    def loss(model, params, buffers, batch):
        pairs = [("net." + k, "correction." + k) for k in part(params, "correction")]
        return corrected(base, pairs)(model, params, buffers, batch)

    return loss


class ScaffoldStrategy(Scaffold, SplitStrategy):
    """Control variates on the network's trainable parameters (not on buffers, spec §8.6); the
    correction sits in the companion network, zero for buffers."""

    def __init__(self, cfg, p, model, tests, data=None):
        super().__init__(
            cfg,
            p,
            model,
            tests,
            data,
            local_epochs=p.body_epochs,
            batch_size=p.batch_size,
            eta_g=p.scaffold_eta_g,
        )
        self.controlled = self.net_params

    def correction_key(self, key: str) -> str:
        return "correction." + key[len("net.") :]

    def corrections(self, start, c, c_i):
        correction = {k: torch.zeros_like(start[k]) for k in self.keys}  # buffers: none
        correction.update({k: c[k] - c_i[k] for k in c})
        return {self.correction_key(k): v for k, v in correction.items()}

    def final_model(self, state):
        zero = {
            self.correction_key(k): torch.zeros_like(v) for k, v in state.server["global"].items()
        }
        return {**super().final_model(state), **zero}


# ------------------------------------------------------------------ APFL and Ditto
def _w_v_alpha(params, buffers):
    state = {**params, **buffers}
    return part(state, "net"), part(state, "personal"), params["alpha"]


def apfl_loss(fedrep_code: bool):
    """CE(w) + CE(v̄), v̄ = α v + (1 − α) sg(w) in parameter space (spec §9.2, paper form);
    FedRep's code mixes α v + α w (``fedrep_code``)."""
    return apfl.apfl_loss(_net_ce, _w_v_alpha, fedrep_code)


def personal_ce():
    """CE of the personal model v (Ditto's personal steps)."""

    def loss(model, params, buffers, batch):
        v = part({**params, **buffers}, "personal")
        return _ce(model.net, v, batch.views[0], batch.labels, batch.valid)

    return loss


def _anchor_of(key: str) -> str | None:
    """Ditto's proximal point of a personal entry: the round-start network (the anchor)."""
    return "anchor." + key[len("personal.") :] if key.startswith("personal.") else None


class PersonalModelStrategy(PersonalModel, SplitStrategy):
    """FedAvg of w plus a personal model v (and APFL's α) kept by each client; v starts as the
    initial network, like local training's."""

    def __init__(self, cfg, p, model, tests, data=None):
        super().__init__(cfg, p, model, tests, data)
        own = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.initial = {k: v for k, v in own.items() if k.startswith("personal.") or k == "alpha"}

    def party_state(self, state, client):
        """Ditto: v. APFL: α v + (1 − α) w (the correct mixture, in every mode)."""
        own, glob = self.own(state, client), state.server["global"]
        v = part(own, "personal")
        if self.p.variant == "ditto":
            return v
        return apfl.apfl_mixture(own["alpha"], v, part(glob, "net"))


# ------------------------------------------------------------------ Per-FedAvg
def perfedavg_loss(alpha: float, order: str, delta: float):
    """Per-FedAvg's meta-gradient (spec §11.2) on the party's network."""
    return perfedavg.perfedavg_loss(
        _net_ce, lambda params, buffers: part({**params, **buffers}, "net"), alpha, order, delta
    )


class PerFedAvgStrategy(SplitStrategy):
    """FedAvg of the meta-learned w; each party is scored after one α-step from w on a seeded
    batch of its own training data (spec §11.4)."""

    def outputs(self, state, round_):
        t, data, p = self.tests, self.data, self.p
        w = part(state.server["global"], "net")
        net = self.model.net

        def f(weights, batch):
            return _ce(net, weights, *batch, None)

        parties = []
        for c in range(len(t.clients)):
            idx = numpy_rng(p.seed, "adapt", round_, c).permutation(data.clients[c])
            idx = torch.as_tensor(idx[: p.batch_size], device=data.device)
            batch = (to_float(data.images[idx]), data.labels[idx])
            parties.append(perfedavg.adapted(f, w, batch, p.perfedavg_alpha))
        return client_outputs(
            lambda c, x: functional_call(net, parties[c], (x,)), t.images, t.labels, t.clients
        )


# ------------------------------------------------------------------ wiring
STRATEGIES = {
    "scaffold": ScaffoldStrategy,
    "apfl": PersonalModelStrategy,
    "ditto": PersonalModelStrategy,
    "perfedavg": PerFedAvgStrategy,
}


def local_schedule(p, strategy: SplitStrategy, cohort) -> list[Phase]:
    """The variant's local phases; ``cohort(loss, epochs, batch_size, after_step)`` builds a
    cohort trainer of the party's network."""
    net, epochs = strategy.net_params, p.body_epochs
    if p.variant == "scaffold":  # the schedule SCAFFOLD counts its K local steps by
        trainer = cohort(scaffold_loss(), strategy.local_epochs, strategy.batch_size)
        return [Phase(trainer, lambda s: net)]
    personal = (
        {k for k in strategy.initial if k.startswith("personal.")}
        if p.variant
        in (
            "apfl",
            "ditto",
        )
        else set()
    )
    if p.variant == "apfl":
        names = net | personal | ({"alpha"} if p.apfl_adaptive else set())
        after = apfl.clip_alpha() if p.apfl_adaptive else None
        return [Phase(cohort(apfl_loss(p.fedrep_code), epochs, after_step=after), lambda s: names)]
    if p.variant == "ditto":  # v steps on the very batches w stepped on (seed_tag ())
        prox = ditto_prox(p.ditto_lambda, p.lr, _anchor_of)
        return [
            Phase(cohort(ce_loss(), epochs), lambda s: net),
            Phase(cohort(personal_ce(), epochs, after_step=prox), lambda s: personal, ()),
        ]
    parts = 2 if p.perfedavg_order == "first_order" else 3
    loss = perfedavg_loss(p.perfedavg_alpha, p.perfedavg_order, p.perfedavg_delta)
    return [Phase(cohort(loss, epochs, batch_size=parts * p.batch_size), lambda s: net)]
