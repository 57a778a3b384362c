"""A personal model per client beside the global one (Ditto's and APFL's v, APFL's α): the
entries of ``initial`` start each client's state, and each client keeps its trained values
across rounds (``FedState.clients``, so a resumed run continues exactly)."""

from __future__ import annotations

from fedssl.fl.cohort import Tensors
from fedssl.fl.state import FedState
from fedssl.strategies.base import Strategy


class PersonalModel(Strategy):
    """Mixed into a strategy; set ``initial`` (the personal entries' starting values, e.g. the
    untrained network's, as a client that trained alone would start) before the first round."""

    initial: Tensors = {}

    def local_start(self, state: FedState, client: int, received: Tensors) -> Tensors:
        start = super().local_start(state, client, received)
        return {**start, **self.own(state, client)}

    def keep(self, state: FedState, client: int, trained: Tensors) -> Tensors | None:
        kept = super().keep(state, client, trained) or {}
        return {**kept, **{k: trained[k] for k in self.initial}}

    def own(self, state: FedState, client: int) -> Tensors:
        """The client's personal entries now (the initial ones before it first trained)."""
        kept = state.clients.get(client, {})
        return {k: kept.get(k, v) for k, v in self.initial.items()}

    def final_model(self, state: FedState) -> Tensors:
        return {**super().final_model(state), **self.initial}
