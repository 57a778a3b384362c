"""SCAFFOLD (Karimireddy et al., 2020): control variates against client drift.

The server keeps c, each client its c_i (``FedState.clients``, kept across rounds); both travel
(kind ``control``); every local step descends g − c_i + c, through a term <w, sg(c − c_i)>
added to any local loss (:func:`corrected`); after its K steps a client updates c_i by option
II and uploads Δc_i; the server moves x by η_g · mean(y_i − x) and c by Σ Δc_i / N over all N
clients, not the sampled ones. Control variates cover the trained parameters, not buffers
(those are averaged as FedAvg does).

:class:`Scaffold` mixes into any strategy; it needs the keys under control (``controlled``,
by default the model's trained parameters, set by :meth:`Scaffold.local_objective`) and where a
client's state holds the correction of each (``correction_key``, by default ``scaffold.<key>``,
which the method's loss never sees). Its aggregation reads every upload (the stacked path).
"""

from __future__ import annotations

import torch
from torch import nn

from fedssl.fl.cohort import LossFn, Tensors
from fedssl.fl.state import FedState, RoundUpdates
from fedssl.strategies.aggregation import fedavg, stacked
from fedssl.strategies.base import Strategy, trained_parameters
from fedssl.strategies.personal import part

CONTROL = "control."  # c in a download, Δc_i in an upload, c_i in what a client keeps
CORRECTION = "scaffold."  # c − c_i in a client's state (the default ``correction_key``)


def option_two(c_i: dict, c: dict, x: dict, y: dict, steps: int, lr: float) -> dict:
    """SCAFFOLD's option II: c_i+ = c_i − c + (x − y) / (K η_l)."""
    return {k: c_i[k] - c[k] + (x[k] - y[k]) / (steps * lr) for k in c_i}


def scaffold_server(x: dict, c: dict, ys: list[dict], dcs: list[dict], eta_g: float, n: int):
    """x += η_g · mean_S (y_i − x);  c += Σ_S Δc_i / N (N = all clients, not |S|)."""
    new_x = {k: x[k] + eta_g * torch.stack([y[k] - x[k] for y in ys]).mean(0) for k in x}
    new_c = {k: c[k] + torch.stack([d[k] for d in dcs]).sum(0) / n for k in c}
    return new_x, new_c


def corrected(loss: LossFn, pairs) -> LossFn:
    """``loss`` + Σ <w, sg(c − c_i)> over (trained key, correction key) ``pairs``: its
    gradient is SCAFFOLD's corrected g − c_i + c."""

    def objective(model, params, buffers, batch):
        value, both = loss(model, params, buffers, batch), {**params, **buffers}
        return value + sum((params[w] * both[c].detach()).sum() for w, c in pairs)

    return objective


def control_part(tensors: Tensors) -> Tensors:
    """The ``control.*`` entries, without the prefix."""
    return {k[len(CONTROL) :]: v for k, v in tensors.items() if k.startswith(CONTROL)}


class Scaffold(Strategy):
    """SCAFFOLD over the strategy it is mixed into (alone: over FedAvg). ``local_epochs`` and
    ``batch_size``: the clients' local schedule (of the last phase, if several), which gives
    each client's K; the method builds its trainer with the same."""

    def __init__(self, *args, local_epochs: int, batch_size: int, eta_g: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.local_epochs, self.batch_size, self.eta_g = local_epochs, batch_size, eta_g
        self.controlled: set[str] | None = None

    def correction_key(self, key: str) -> str:
        return CORRECTION + key

    def local_objective(self, loss: LossFn, model: nn.Module) -> LossFn:
        """The method's loss (which never sees the corrections) plus the drift term."""
        if self.controlled is None:
            self.controlled = set(trained_parameters(model))

        def plain(model, params, buffers, batch):  # the method's loss never sees c − c_i
            return loss(model, params, self.without_corrections(buffers), batch)

        names = [k for k in trained_parameters(model) if k in self.controlled]
        pairs = [(k, self.correction_key(k)) for k in names]
        return super().local_objective(corrected(plain, pairs), model)

    def init_server(self, model):
        server = super().init_server(model)
        server["control"] = {k: torch.zeros_like(server["global"][k]) for k in self.controlled}
        return server

    def download(self, state, client):
        control = state.server["control"]
        return {**super().download(state, client), **{CONTROL + k: control[k] for k in control}}

    def traffic(self, tensors):
        control = {k: v for k, v in tensors.items() if k.startswith(CONTROL)}
        rest = super().traffic({k: v for k, v in tensors.items() if k not in control})
        return {**rest, "control": control} if control else rest

    @staticmethod
    def c(state) -> dict:
        return state.server["control"]

    def c_i(self, state, client) -> dict:
        kept = state.clients.get(client, {})
        return {k: kept.get(CONTROL + k, torch.zeros_like(v)) for k, v in self.c(state).items()}

    def corrections(self, start: Tensors, c: dict, c_i: dict) -> Tensors:
        """c − c_i of each controlled key, under its ``correction_key``."""
        return {self.correction_key(k): c[k] - c_i[k] for k in c}

    def local_start(self, state, client, received):
        start = super().local_start(state, client, received)
        start = {k: v for k, v in start.items() if not k.startswith(CONTROL)}
        corrections = self.corrections(start, control_part(received), self.c_i(state, client))
        return {**start, **corrections}

    def local_steps(self, state: FedState, client: int) -> int:
        """K: the client's local steps this round (its batches over the local epochs)."""
        n = state.ledger.samples[client]
        return self.local_epochs * max(1, -(-n // self.batch_size))

    def new_control(self, state, client, trained) -> dict:
        """c_i+ of the client after its local steps (from x, the global model it started at)."""
        x = state.server["global"]
        y = {k: trained[k] for k in self.controlled}
        steps, lr = self.local_steps(state, client), self.lr(state.round)
        return option_two(self.c_i(state, client), self.c(state), x, y, steps, lr)

    def upload(self, state, client, trained):
        c_plus, c_i = self.new_control(state, client, trained), self.c_i(state, client)
        delta = {CONTROL + k: c_plus[k] - c_i[k] for k in c_plus}
        return {**super().upload(state, client, self.without_corrections(trained)), **delta}

    def keep(self, state, client, trained):
        c_plus = self.new_control(state, client, trained)
        kept = super().keep(state, client, self.without_corrections(trained)) or {}
        return {**kept, **{CONTROL + k: v for k, v in c_plus.items()}}

    @staticmethod
    def without_corrections(tensors: Tensors) -> Tensors:
        return {k: v for k, v in tensors.items() if not k.startswith(CORRECTION)}

    def aggregate(self, state: FedState, updates: RoundUpdates) -> None:
        """x and c by SCAFFOLD's server step; any other uploaded key of the global model (a
        buffer) by FedAvg."""
        glob = state.server["global"]
        params = sorted(self.controlled)
        x = {k: glob[k] for k in params}
        ys = [{k: u[k] for k in params} for u in updates.uploads]
        dcs = [control_part(u) for u in updates.uploads]
        new_x, new_c = scaffold_server(x, self.c(state), ys, dcs, self.eta_g, state.num_clients)
        first = updates.uploads[0]
        others = [k for k in glob if k in first and k not in self.controlled]
        avg = fedavg(stacked(updates.uploads, others), updates.weights) if others else {}
        state.server["global"] = {**glob, **new_x, **avg}
        state.server["control"] = new_c


def companion_corrected(loss: LossFn, of: str = "net", name: str = "correction") -> LossFn:
    """:func:`corrected` where c − c_i lives in the companion network ``name`` of the module's
    network ``of`` (``of.k`` corrected by ``name.k``)."""

    def objective(model, params, buffers, batch):
        pairs = [(f"{of}.{k}", f"{name}.{k}") for k in part(params, name)]
        return corrected(loss, pairs)(model, params, buffers, batch)

    return objective


class CompanionScaffold(Scaffold):
    """SCAFFOLD whose correction c − c_i a client's module holds in the companion network
    ``name`` beside its network ``of`` (:func:`fedssl.strategies.personal.with_companion`):
    the corrections of ``of``'s parameters, zero for its buffers; its loss is
    :func:`companion_corrected`. The final model's companion is zero."""

    of, name = "net", "correction"

    def correction_key(self, key: str) -> str:
        return self.name + key[len(self.of) :]

    def corrections(self, start, c, c_i):
        network = [k for k in start if k.startswith(self.of + ".")]
        correction = {k: torch.zeros_like(start[k]) for k in network}  # buffers: none
        correction.update({k: c[k] - c_i[k] for k in c})
        return {self.correction_key(k): v for k, v in correction.items()}

    def final_model(self, state):
        glob = state.server["global"]
        zero = {self.correction_key(k): torch.zeros_like(v) for k, v in glob.items()}
        return {**super().final_model(state), **zero}
