"""The BYOL family's federation (FedBYOL, FedU, FedEMA; spec §2.2 step 2, §3.2 step 2): how
a client of a BYOL-style model starts its round. A client's first round starts from the global
model with a target equal to the global encoder; afterwards it keeps its own target and, per
strategy, takes the global online network and predictor (FedBYOL), a DAPU choice of predictor
(FedU) or an EMA blend (FedEMA). The server averages the online network and predictor as FedAvg
does (summed as the clients finish). Everything a client carries (its last trained network,
its divergence d_k, FedEMA's scaler λ_k) lives in the federation's state, so a resumed run
continues exactly.

The model's contract: its online encoder and predictor are named ``encoder.*`` and
``predictor.*`` (what travels), its target ``target.encoder.*`` (what stays on the client).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from fedssl.fl.state import FederationConfig, FedState, model_state
from fedssl.strategies.base import Strategy

Tensors = dict[str, torch.Tensor]
TARGET = "target."  # the target's names: TARGET + the online encoder's
ONLINE = ("encoder.", "predictor.")  # what travels


def online_names(model: nn.Module) -> list[str]:
    """The parameters the clients train (the target's move by EMA only)."""
    return [k for k, _ in model.named_parameters() if k.startswith(ONLINE)]


def conv_weights(model: nn.Module) -> list[str]:
    """The tensors the divergence is measured on (EasyFL: names with 'conv' and 'weight'):
    the online backbone's convolution kernels, 1x1 shortcut convolutions excluded."""
    return [
        k
        for k, v in model.named_parameters()
        if k.startswith("encoder.backbone.") and v.dim() == 4 and ".shortcut." not in k
    ]


@torch.no_grad()
def divergence(a: Tensors, b: Tensors, keys: list[str]) -> float:
    """d = (1/J) Σ_j ||a_j - b_j||_2 over the J tensors ``keys`` (spec §2.2 step 4)."""
    return float(torch.stack([(a[k].double() - b[k].double()).norm() for k in keys]).mean())


def target_of(online: Tensors) -> Tensors:
    """A target equal to the online encoder (a client's first round: ξ <- θ_g)."""
    return {TARGET + k: v for k, v in online.items() if k.startswith("encoder.")}


class FedBYOLStrategy(Strategy):
    """The online network and predictor travel and are averaged; a returning client replaces
    both with the global ones and keeps its target."""

    def __init__(self, cfg: FederationConfig, model: nn.Module):
        super().__init__(cfg)
        self.online = set(online_names(model))
        self.convs = conv_weights(model)
        self._starts: dict[int, Tensors] = {}  # this round: each client's starting conv weights
        self._stats: dict[str, list[float]] = defaultdict(list)  # this round, for the log

    def init_server(self, model) -> dict[str, Tensors]:
        state = model_state(model)
        return {"global": {k: v for k, v in state.items() if not k.startswith(TARGET)}}

    def trainable(self, state: FedState) -> set[str]:
        return self.online

    def traffic(self, tensors: Tensors) -> dict[str, Tensors]:
        return {
            kind: {k: v for k, v in tensors.items() if k.startswith(kind + ".")}
            for kind in ("encoder", "predictor")
        }

    def local_start(self, state: FedState, client: int, received: Tensors) -> Tensors:
        kept = state.clients.get(client)
        if kept is None:
            start = {**received, **target_of(received)}
        else:
            start = {**kept, **self.online_start(state, client, received, kept)}
        self._starts[client] = {k: start[k] for k in self.convs}
        return start

    def online_start(self, state: FedState, client: int, received: Tensors, kept: Tensors):
        """A returning client's online network and predictor (its target is ``kept``'s)."""
        return received

    def upload(self, state: FedState, client: int, trained: Tensors) -> Tensors:
        return {k: v for k, v in trained.items() if not k.startswith(TARGET)}

    def keep(self, state: FedState, client: int, trained: Tensors) -> Tensors:
        """The whole trained network stays, and how far local training moved it (d_k)."""
        d = divergence(trained, self._starts.pop(client), self.convs)
        state.memo.setdefault("divergence", {})[client] = d
        self._stats["divergence"].append(d)
        return trained

    def final_model(self, state: FedState) -> Tensors:
        """The global online network and predictor (the target, client-side only, set to the
        global encoder so the whole network loads)."""
        return {**state.server["global"], **target_of(state.server["global"])}

    def evaluate(self, state: FedState, round_: int) -> dict:
        """The round's means of what the clients recorded (divergence, decay, DAPU choices)."""
        out = {k: round(sum(v) / len(v), 6) for k, v in self._stats.items() if v}
        self._stats.clear()
        return out


class FedUStrategy(FedBYOLStrategy):
    """DAPU: the global predictor only when the client's last divergence is below the
    threshold (the decision is taken at its next participation, as in the authors' code)."""

    def __init__(self, cfg: FederationConfig, model: nn.Module, threshold: float):
        super().__init__(cfg, model)
        self.threshold = threshold

    def online_start(self, state, client, received, kept):
        keep_local = state.memo["divergence"][client] >= self.threshold
        self._stats["local_predictor"].append(float(keep_local))
        if not keep_local:
            return received
        return {**received, **{k: v for k, v in kept.items() if k.startswith("predictor.")}}


class FedEMAStrategy(FedBYOLStrategy):
    """The divergence-aware EMA: θ, φ <- (1-μ)·global + μ·own previous, parameters only (BN
    buffers come from the global model), μ = min(λ_k·d_k, 1). ``divergence``: d_k of the
    client's last local training (``local_progress``) or between the global model and the
    client's own (``global_vs_local``)."""

    def __init__(self, cfg: FederationConfig, model: nn.Module, tau: float, divergence: str):
        super().__init__(cfg, model)
        self.tau, self.measure = tau, divergence

    def online_start(self, state, client, received, kept):
        mu = self.decay(state, client, received, kept)
        self._stats["decay"].append(mu)
        return {
            k: torch.lerp(v, kept[k], mu) if k in self.online else v for k, v in received.items()
        }

    def decay(self, state: FedState, client: int, received: Tensors, kept: Tensors) -> float:
        """μ_k; the autoscaler fixes λ_k = τ / d_k at the first blend with d_k > 0 (so that
        blend has μ = τ; until then μ = 0, spec §2.6 pitfall 2)."""
        if self.measure == "global_vs_local":
            d = divergence(received, kept, self.convs)
        else:
            d = state.memo["divergence"][client]
        scalers = state.memo.setdefault("scaler", {})
        if client not in scalers and d > 0:
            scalers[client] = self.tau / d
        return min(scalers.get(client, 0.0) * d, 1.0)
