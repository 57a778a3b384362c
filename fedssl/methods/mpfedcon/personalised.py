"""The personalised baselines of MpFedcon's Tab. 1 (spec methods/baselines.md §8-11) on the
layered network: the library's SCAFFOLD, APFL, Ditto and Per-FedAvg over a companion network
(:mod:`fedssl.strategies.personal`: the personal model v of APFL / Ditto, or SCAFFOLD's step
correction c − c_i, beside ``net`` in the same module) bound to
:class:`~fedssl.methods.mpfedcon.train.SplitStrategy` with every layer shared. What stays here
is the binding: which companion a variant needs, its settings, its local phases and
Per-FedAvg's scoring on the parties' own data.

Evaluation is the shared personalised one (every party's model on its own test split).
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from fedssl.data.augment import to_float
from fedssl.methods.mpfedcon.nets import Anchored, part
from fedssl.methods.mpfedcon.train import SplitStrategy, ce_loss
from fedssl.rounds.loop import Phase
from fedssl.stage.runtime import numpy_rng
from fedssl.strategies import apfl, perfedavg, personal
from fedssl.strategies.ditto import anchor_of, ditto_prox, personal_ce
from fedssl.strategies.personal import PersonalModel, network_ce
from fedssl.strategies.scaffold import CompanionScaffold, companion_corrected

COMPANION = {"scaffold": "correction", "apfl": "personal", "ditto": "personal"}


def with_companion(p, model: Anchored) -> Anchored:
    """The variant's model: ``model`` as it is, or with the companion network it needs beside
    ``net`` (:func:`fedssl.strategies.personal.with_companion`)."""
    if p.variant not in COMPANION:
        return model
    alpha = p.apfl_alpha if p.variant == "apfl" else None
    return personal.with_companion(model, COMPANION[p.variant], "net", alpha)


# ------------------------------------------------------------------ SCAFFOLD
def scaffold_loss():
    """CE + <w, sg(c − c_i)>: its gradient is the corrected g − c_i + c of SCAFFOLD; c − c_i
    lives in the companion network ``correction``."""
    return companion_corrected(ce_loss(), "net", "correction")


class ScaffoldStrategy(CompanionScaffold, SplitStrategy):
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
            batch_size=p.federation.batch_size,
            eta_g=p.scaffold_eta_g,
        )
        self.controlled = self.net_params


# ------------------------------------------------------------------ APFL and Ditto
def apfl_loss(fedrep_code: bool):
    """CE(w) + CE(v̄), v̄ = α v + (1 − α) sg(w) in parameter space (spec §9.2, paper form);
    FedRep's code mixes α v + α w (``fedrep_code``)."""
    return apfl.companion_apfl_loss("net", "personal", fedrep_code)


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
    return perfedavg.companion_perfedavg_loss(alpha, order, delta, "net")


class PerFedAvgStrategy(SplitStrategy):
    """FedAvg of the meta-learned w; each party is scored after one α-step from w on a seeded
    batch of its own training data (spec §11.4)."""

    def scorer(self, state, round_):
        t, data, p = self.tests, self.data, self.p
        w = part(state.server["global"], "net")
        net, ce = self.model.net, network_ce("net")

        def f(weights, batch):
            return ce(self.model, weights, *batch, None)

        parties = []
        for c in range(len(t.clients)):
            idx = numpy_rng(p.seed, "adapt", round_, c).permutation(data.clients[c])
            idx = torch.as_tensor(idx[: p.federation.batch_size], device=data.device)
            batch = (to_float(data.images[idx]), data.labels[idx])
            parties.append(perfedavg.adapted(f, w, batch, p.perfedavg_alpha))
        return lambda c, x: functional_call(net, parties[c], (x,))


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
        prox = ditto_prox(p.ditto_lambda, p.federation.lr, anchor_of("personal", "anchor"))
        return [
            Phase(cohort(ce_loss(), epochs), lambda s: net),
            Phase(
                cohort(personal_ce("net", "personal"), epochs, after_step=prox),
                lambda s: personal,
                (),
            ),
        ]
    parts = 2 if p.perfedavg_order == "first_order" else 3
    loss = perfedavg_loss(p.perfedavg_alpha, p.perfedavg_order, p.perfedavg_delta)
    return [Phase(cohort(loss, epochs, batch_size=parts * p.federation.batch_size), lambda s: net)]
