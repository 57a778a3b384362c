"""The strategy of split federated MoCo (:class:`SflSync`): the server's state at round 0, each
client's starting state (its kept online / momentum / SGD state, or the latest synced models it
has missed), and the synchronisation: a data-size-weighted FedAvg of the participating clients'
online models (MonAcoSFL: and of their momentum models), broadcast to every client.

Where it keeps things (:class:`~fedssl.fl.state.FedState`, so the checkpoint is exact):
``state.server``: ``server`` / ``server_momentum`` / ``server_opt`` (top + projector, its EMA,
its SGD momentum), ``queue`` (keys and write pointer), ``sync`` (the latest synced client
models and how many syncs happened), ``client_init`` (the common initial client model);
``state.clients[c]``: client c's online and momentum models, SGD momentum and the sync it last
saw."""

from __future__ import annotations

import torch

from fedssl.fl.state import FederationConfig, FedState, RoundUpdates
from fedssl.methods.mocosfl.comm import SYNC_MOMENTUM, SYNC_ONLINE
from fedssl.methods.mocosfl.nets import SplitNets, Tensors
from fedssl.models.momentum import FeatureQueue
from fedssl.stage.runtime import derive_seed
from fedssl.strategies.aggregation import fedavg
from fedssl.strategies.base import Strategy


def prefixed(tensors: Tensors, prefix: str) -> Tensors:
    return {f"{prefix}.{k}": v for k, v in tensors.items()}


def unprefixed(tensors: Tensors, prefix: str) -> Tensors:
    n = len(prefix) + 1
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}


def _count(state: FedState, what: str, client: int) -> None:
    """Per-client event counters in the memo (for the analytic communication check)."""
    counts = state.memo.setdefault(what, [0] * len(state.ledger.samples))
    counts[client] += 1


class SflSync(Strategy):
    """Client starts and synchronisation of MocoSFL (``align=False``) and MonAcoSFL
    (``align=True``: the clients' momentum models are averaged too)."""

    def __init__(
        self, cfg: FederationConfig, nets: SplitNets, align: bool, queue_size: int, seed: int
    ):
        super().__init__(cfg)
        self.nets, self.align, self.queue_size, self.seed = nets, align, queue_size, seed

    def init_server(self, model=None) -> dict:
        client, top = self.nets.client_state(), self.nets.top_state()
        queue = FeatureQueue(
            self.queue_size,
            self.nets.top.projector.out_dim,
            derive_seed(self.seed, "queue"),
            next(iter(top.values())).device,
        )
        sync = {**prefixed(client, "online"), "count": torch.zeros((), dtype=torch.int64)}
        if self.align:
            sync.update(prefixed(client, "momentum"))
        return {
            "client_init": client,
            "server": top,
            "server_momentum": {k: v.clone() for k, v in top.items()},
            "server_opt": {k: torch.zeros_like(v) for k, v in top.items()},
            "queue": {"keys": queue.keys, "ptr": torch.zeros((), dtype=torch.int64)},
            "sync": sync,
        }

    def client_start(self, state: FedState, client: int) -> dict[str, Tensors]:
        """Client ``client``'s online, momentum and SGD state at the start of its round. A sync
        reaches every client: one that missed syncs downloads the latest synced model(s) now
        (counted once, however many it missed); a client that never trained starts from the
        common initialisation (and, for MocoSFL, a momentum model that is that initialisation)."""
        sync, kept = state.server["sync"], state.clients.get(client)
        count = int(sync["count"])
        init = state.server["client_init"]
        if kept is not None:
            online, momentum = unprefixed(kept, "online"), unprefixed(kept, "momentum")
            opt = unprefixed(kept, "opt")
            missed = int(kept["sync_id"]) < count
        else:
            online, momentum = init, init
            opt = {k: torch.zeros_like(v) for k, v in init.items()}
            missed = count > 0
        if missed:
            _count(state, "catch_ups", client)
            online = unprefixed(sync, "online")
            state.ledger.received(client, online, SYNC_ONLINE)
            if self.align:
                momentum = unprefixed(sync, "momentum")
                state.ledger.received(client, momentum, SYNC_MOMENTUM)
        return {"online": online, "momentum": momentum, "opt": opt}

    def keep_client(
        self, state: FedState, client: int, online: Tensors, momentum: Tensors, opt: Tensors
    ) -> None:
        """What client ``client`` keeps after its round, and the sync it saw last."""
        state.clients[client] = {
            **prefixed(online, "online"),
            **prefixed(momentum, "momentum"),
            **prefixed(opt, "opt"),
            "sync_id": state.server["sync"]["count"].clone(),
        }

    @torch.no_grad()
    def sync(
        self,
        state: FedState,
        clients: list[int],
        online: Tensors,
        momentum: Tensors,
        weights: torch.Tensor,
    ) -> None:
        """Data-size-weighted FedAvg of the participating clients' (client-stacked) online
        models, written back into every row; MonAcoSFL does the same with the momentum models.
        Each participant uploads its model(s) and downloads the average(s)."""
        ledger = state.ledger
        mean = fedavg(online, weights)
        for i, c in enumerate(clients):
            _count(state, "syncs", c)
            ledger.sent(c, {k: v[i] for k, v in online.items()}, SYNC_ONLINE)
            ledger.received(c, mean, SYNC_ONLINE)
        for k, v in online.items():
            v.copy_(mean[k].expand_as(v))
        sync = state.server["sync"]
        sync.update(prefixed({k: v.clone() for k, v in mean.items()}, "online"))
        if self.align:
            mean_m = fedavg(momentum, weights)
            for i, c in enumerate(clients):
                ledger.sent(c, {k: v[i] for k, v in momentum.items()}, SYNC_MOMENTUM)
                ledger.received(c, mean_m, SYNC_MOMENTUM)
            for k, v in momentum.items():
                v.copy_(mean_m[k].expand_as(v))
            sync.update(prefixed({k: v.clone() for k, v in mean_m.items()}, "momentum"))
        sync["count"] += 1

    def aggregate(self, state: FedState, updates: RoundUpdates) -> None:
        pass  # the trainer synchronises during the round

    def evaluate(self, state: FedState, round_: int) -> dict | None:
        steps = state.memo.get("steps") or []
        return {"misalignment": steps[-1]["misalignment"]} if steps else {}

    def final_model(self, state: FedState) -> dict:
        return {
            "client": unprefixed(state.server["sync"], "online"),
            "server": state.server["server"],
        }

    def load_final(self, model: SplitNets, state: FedState) -> None:
        """The synced client part into the client template, the server's into the top."""
        final = self.final_model(state)
        model.client.load_state_dict(final["client"])
        model.top.load_state_dict(final["server"])
