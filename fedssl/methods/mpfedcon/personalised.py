"""The personalised baselines of MpFedcon's Tab. 1 (spec methods/baselines.md §8-11) on the
layered network and the engine's hooks: SCAFFOLD, APFL, Ditto and Per-FedAvg. Each shares the
whole network like FedAvg (:class:`~fedssl.methods.mpfedcon.train.SplitStrategy` with every
layer shared) and adds what defines it:

* SCAFFOLD: the server keeps c, each client its c_i (``FedState.clients``, kept across rounds);
  both travel (kind ``control``); every local step descends g − c_i + c (option II update of
  c_i after the client's K steps; the server divides the Σ Δc_i by all N clients);
* APFL: each client keeps a personal model v and its α; a step trains w on CE(w) and v on
  CE(α v + (1 − α) sg(w)); α learns through the same loss when ``apfl_adaptive``;
* Ditto: the global model trains as in FedAvg, then the personal model v on the same batches
  with the exact proximal step towards the round-start global w^t;
* Per-FedAvg: each step is a MAML meta-step on three slices of the batch (first-order or
  Hessian-free); a client's personal model is one α-step from the global model on its data.

Evaluation is the shared personalised one (every party's model on its own test split).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call, grad, grad_and_value

from fedssl.data.augment import to_float
from fedssl.eval.personal import client_outputs
from fedssl.fl.cohort import Batch
from fedssl.fl.engine import FedState, Phase, RoundUpdates, fedavg, stacked
from fedssl.losses import masked_cross_entropy
from fedssl.methods.mpfedcon.nets import Anchored, part
from fedssl.methods.mpfedcon.train import SplitStrategy, _forward, ce_loss
from fedssl.precision import autocast
from fedssl.runtime import numpy_rng

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
    with autocast(x):
        logits = functional_call(net, weights, (x,))
    return masked_cross_entropy(logits, labels, valid)


# ------------------------------------------------------------------ SCAFFOLD
def scaffold_loss():
    """CE + <w, sg(c − c_i)>: its gradient is the corrected g − c_i + c of SCAFFOLD."""

    def loss(model, params, buffers, batch):
        logits, _, _ = _forward(model, params, buffers, batch)
        ce = masked_cross_entropy(logits, batch.labels, batch.valid)
        drift = sum(
            (params["net." + k] * c.detach()).sum() for k, c in part(params, "correction").items()
        )
        return ce + drift

    return loss


def option_two(c_i: dict, c: dict, x: dict, y: dict, steps: int, lr: float) -> dict:
    """SCAFFOLD's option II: c_i+ = c_i − c + (x − y) / (K η_l)."""
    return {k: c_i[k] - c[k] + (x[k] - y[k]) / (steps * lr) for k in c_i}


def scaffold_server(x: dict, c: dict, ys: list[dict], dcs: list[dict], eta_g: float, n: int):
    """x += η_g · mean_S (y_i − x);  c += Σ_S Δc_i / N (N = all clients, not |S|)."""
    new_x = {k: x[k] + eta_g * torch.stack([y[k] - x[k] for y in ys]).mean(0) for k in x}
    new_c = {k: c[k] + torch.stack([d[k] for d in dcs]).sum(0) / n for k in c}
    return new_x, new_c


class ScaffoldStrategy(SplitStrategy):
    """Control variates on the trainable parameters (not on buffers, spec §8.6)."""

    def init_server(self, model):
        server = super().init_server(model)
        server["control"] = {k: torch.zeros_like(server["global"][k]) for k in self.net_params}
        return server

    def download(self, state, client):
        control = state.server["control"]
        return {**super().download(state, client), **{"control." + k: control[k] for k in control}}

    def traffic(self, tensors):
        control = {k: v for k, v in tensors.items() if k.startswith("control.")}
        rest = super().traffic({k: v for k, v in tensors.items() if k not in control})
        return {**rest, "control": control} if control else rest

    def c_i(self, state, client) -> dict:
        kept = state.clients.get(client, {})
        return {k: kept.get("control." + k, torch.zeros_like(v)) for k, v in self.c(state).items()}

    @staticmethod
    def c(state) -> dict:
        return state.server["control"]

    def local_start(self, state, client, received):
        start = super().local_start(state, client, received)
        c = part(received, "control")
        c_i = self.c_i(state, client)
        correction = {k: torch.zeros_like(start[k]) for k in self.keys}  # buffers: none
        correction.update({k: c[k] - c_i[k] for k in c})
        return {**start, **{"correction." + k[len("net.") :]: v for k, v in correction.items()}}

    def steps(self, client: int) -> int:
        """K: the client's local steps this round (its batches over the local epochs)."""
        n = len(self.fed.data.clients[client])
        return self.p.body_epochs * max(1, -(-n // self.p.batch_size))

    def new_control(self, state, client, trained) -> dict:
        """c_i+ of the client after its local steps (from x, the global model it started at)."""
        x = state.server["global"]
        y = {k: trained[k] for k in self.net_params}
        steps, lr = self.steps(client), self.lr(state.round)
        return option_two(self.c_i(state, client), self.c(state), x, y, steps, lr)

    def upload(self, state, client, trained):
        c_plus, c_i = self.new_control(state, client, trained), self.c_i(state, client)
        delta = {"control." + k: c_plus[k] - c_i[k] for k in c_plus}
        return {**super().upload(state, client, trained), **delta}

    def keep(self, state, client, trained):
        c_plus = self.new_control(state, client, trained)
        return {"control." + k: v for k, v in c_plus.items()}

    def aggregate(self, state: FedState, updates: RoundUpdates) -> None:
        glob = state.server["global"]
        params = sorted(self.net_params)
        x = {k: glob[k] for k in params}
        ys = [{k: u[k] for k in params} for u in updates.uploads]
        dcs = [part(u, "control") for u in updates.uploads]
        new_x, new_c = scaffold_server(
            x, self.c(state), ys, dcs, self.p.scaffold_eta_g, len(self.fed.data.clients)
        )
        others = [k for k in self.keys if k not in self.net_params]  # buffers: FedAvg
        avg = fedavg(stacked(updates.uploads, others), updates.weights) if others else {}
        state.server["global"] = {**glob, **new_x, **avg}
        state.server["control"] = new_c

    def final_model(self, state):
        zero = {
            "correction." + k[len("net.") :]: torch.zeros_like(v)
            for k, v in state.server["global"].items()
        }
        return {**super().final_model(state), **zero}


# ------------------------------------------------------------------ APFL and Ditto
def apfl_loss(fedrep_code: bool):
    """CE(w) + CE(v̄), v̄ = α v + (1 − α) sg(w) in parameter space (spec §9.2, paper form): w
    learns from its own loss only, v through the mixture (gradient α ∇f(v̄)), α from
    <v − w, ∇f(v̄)> when it trains. FedRep's code mixes α v + α w (``fedrep_code``)."""

    def loss(model, params, buffers, batch):
        x, state = batch.views[0], {**params, **buffers}
        w, v, a = part(state, "net"), part(state, "personal"), params["alpha"]
        b = a if fedrep_code else 1 - a
        mixed = {k: a * v[k] + b * w[k].detach() for k in v}
        return _ce(model.net, w, x, batch.labels, batch.valid) + _ce(
            model.net, mixed, x, batch.labels, batch.valid
        )

    return loss


def clip_alpha(trained, frozen, buffers) -> None:
    """APFL's projection of α onto [0, 1] after each step."""
    trained["alpha"].clamp_(0.0, 1.0)


def personal_ce():
    """CE of the personal model v (Ditto's personal steps)."""

    def loss(model, params, buffers, batch):
        v = part({**params, **buffers}, "personal")
        return _ce(model.net, v, batch.views[0], batch.labels, batch.valid)

    return loss


def ditto_prox(lam: float, lr: float):
    """Ditto's exact proximal step after each SGD step of v (spec §10, stable for any ηλ):
    v <- (v + ηλ w^t) / (1 + ηλ), w^t = the round-start global model (the anchor). η is the
    configured lr (MpFedcon's runs keep it constant over rounds)."""
    k_ = lr * lam

    @torch.no_grad()
    def after(trained, frozen, buffers) -> None:
        for k, v in trained.items():
            if k.startswith("personal."):
                v.add_(frozen["anchor." + k[len("personal.") :]], alpha=k_).div_(1 + k_)

    return after


class PersonalModelStrategy(SplitStrategy):
    """FedAvg of w plus a personal model v (and APFL's α) kept by each client; v starts as the
    initial network, like local training's."""

    def __init__(self, cfg, p, model, tests):
        super().__init__(cfg, p, model, tests)
        own = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.initial = {k: v for k, v in own.items() if k.startswith("personal.") or k == "alpha"}

    def local_start(self, state, client, received):
        kept = state.clients.get(client, {})
        start = super().local_start(state, client, received)
        return {**start, **{k: kept.get(k, v) for k, v in self.initial.items()}}

    def keep(self, state, client, trained):
        return {k: trained[k] for k in self.initial}

    def own(self, state, client) -> dict:
        kept = state.clients.get(client, {})
        return {k: kept.get(k, v) for k, v in self.initial.items()}

    def party_state(self, state, client):
        """Ditto: v. APFL: α v + (1 − α) w (the correct mixture, in every mode)."""
        own, glob = self.own(state, client), state.server["global"]
        v = part(own, "personal")
        if self.p.variant == "ditto":
            return v
        a, w = own["alpha"], part(glob, "net")
        return {k: a * v[k] + (1 - a) * w[k] for k in v}

    def final_model(self, state):
        return {**super().final_model(state), **self.initial}


# ------------------------------------------------------------------ Per-FedAvg
def slices(batch: Batch, n: int) -> list[tuple]:
    """The batch's n interleaved slices (D, D', D''): each gets its share of the real rows."""
    x = batch.views[0]
    return [(x[i::n], batch.labels[i::n], batch.valid[i::n]) for i in range(n)]


def perfedavg_loss(alpha: float, order: str, delta: float):
    """A loss whose gradient is Per-FedAvg's meta-gradient (spec §11.2) on a batch of 2B (FO) or
    3B (HF) rows: w̃ = w − α sg(∇f(w; D)); FO: ∇f(w̃; D'); HF: that minus α times the
    finite-difference Hessian-vector product on D'' along g = ∇f(w̃; D')."""
    parts = 2 if order == "first_order" else 3

    def loss(model, params, buffers, batch):
        def f(weights, data):
            return _ce(model.net, weights, *data)

        d, d1, *rest = slices(batch, parts)
        w = part({**params, **buffers}, "net")
        g_in = grad(f)(w, d)
        if order == "first_order":
            return f({k: w[k] - alpha * g_in[k].detach() for k in w}, d1)
        return hessian_free_surrogate(f, w, g_in, d1, rest[0], alpha, delta)

    return loss


def hessian_free_surrogate(f, w: dict, g_in: dict, d1, d2, alpha: float, delta: float):
    """HF's meta-step as a surrogate: value f(w̃; D') − α <w, hvp> (the meta-objective's value),
    gradient g − α hvp. g = ∇f(w̃; D') is computed once and serves both the gradient and the
    finite difference (differentiating f(w̃; D') through w̃ = w − const would repeat it)."""
    fixed = {k: v.detach() for k, v in w.items()}
    g, outer = grad_and_value(f)({k: fixed[k] - alpha * g_in[k].detach() for k in w}, d1)
    up = grad(f)({k: fixed[k] + delta * g[k] for k in w}, d2)
    down = grad(f)({k: fixed[k] - delta * g[k] for k in w}, d2)
    hvp = {k: (up[k] - down[k]) / (2 * delta) for k in w}
    value = outer - alpha * sum((fixed[k] * hvp[k]).sum() for k in w)
    linear = sum((w[k] * (g[k] - alpha * hvp[k])).sum() for k in w)
    return value + (linear - linear.detach())  # adds exactly 0 to the value


def adapted(net: nn.Module, w: dict, data, alpha: float) -> dict:
    """One SGD step of size α from w on (images, labels): a Per-FedAvg personal model."""
    g = grad(lambda weights: _ce(net, weights, *data, None))(w)
    return {k: w[k] - alpha * g[k] for k in w}


class PerFedAvgStrategy(SplitStrategy):
    """FedAvg of the meta-learned w; each party is scored after one α-step from w on a seeded
    batch of its own training data (spec §11.4)."""

    def outputs(self, state, round_):
        t, data, p = self.tests, self.fed.data, self.p
        w = part(state.server["global"], "net")
        parties = []
        for c in range(len(t.clients)):
            idx = numpy_rng(p.seed, "adapt", round_, c).permutation(data.clients[c])
            idx = torch.as_tensor(idx[: p.batch_size], device=data.device)
            batch = (to_float(data.images[idx]), data.labels[idx])
            parties.append(adapted(self.model.net, w, batch, p.perfedavg_alpha))
        net = self.model.net
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
    if p.variant == "scaffold":
        return [Phase(cohort(scaffold_loss(), epochs), lambda s: net)]
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
        after = clip_alpha if p.apfl_adaptive else None
        return [Phase(cohort(apfl_loss(p.fedrep_code), epochs, after_step=after), lambda s: names)]
    if p.variant == "ditto":  # v steps on the very batches w stepped on (seed_tag ())
        prox = ditto_prox(p.ditto_lambda, p.lr)
        return [
            Phase(cohort(ce_loss(), epochs), lambda s: net),
            Phase(cohort(personal_ce(), epochs, after_step=prox), lambda s: personal, ()),
        ]
    parts = 2 if p.perfedavg_order == "first_order" else 3
    loss = perfedavg_loss(p.perfedavg_alpha, p.perfedavg_order, p.perfedavg_delta)
    return [Phase(cohort(loss, epochs, batch_size=parts * p.batch_size), lambda s: net)]
