"""The hooks of a federation, in the spirit of Flower's Strategy; the round loop
(:class:`fedssl.rounds.loop.Federation`) calls them each round, in this order:

* ``sample``        which clients train this round;
* ``download``      what the server sends each client (a global model, a whole model pool,
                    the blocks a layer-wise client needs): bytes are counted from these tensors;
* ``local_start``   the client's starting state, from what it received and the state it keeps
                    across rounds (a personal head); may choose a model of a pool (``group``);
* ``trainable``     which parameters train this round (layer-wise training, frozen encoders);
* ``upload``        what a client sends back (a subset, plus extras such as class centres);
* ``traffic``       what kind each sent tensor is, for the ledger (encoder blocks, heads, ...);
* ``keep``          what a client keeps for later rounds (``FedState.clients``);
* ``aggregate``     the server's new state from the uploads, grouped by cluster;
* ``server_step``   work with server-side data after aggregation (calibration, pretraining).

The defaults are FedAvg of the whole model, weighted by client data size. A strategy knows
nothing of the loop that drives it: each hook is handed the federation's state
(:class:`fedssl.fl.state.FedState`, which also says how many clients there are), and a strategy
whose hooks compute on the clients' data is given that data when it is built.
"""

from __future__ import annotations

from torch import nn

from fedssl.fl.cohort import LocalData, LossFn, Tensors
from fedssl.fl.state import (
    FederationConfig,
    FedState,
    Ledger,
    RoundUpdates,
    cosine_lr,
    model_state,
    sample_clients,
)
from fedssl.strategies.aggregation import fedavg, stacked


def trained_parameters(model: nn.Module) -> list[str]:
    """The parameters local training can move, in order (frozen copies such as a BYOL target
    or MOON's references excluded)."""
    return [k for k, q in model.named_parameters() if q.requires_grad]


class Strategy:
    """The hooks of a federation. The defaults: all or a seeded fraction of the clients, the
    global model down and the whole trained model up, data-size weighted FedAvg."""

    def __init__(self, cfg: FederationConfig, data: LocalData | None = None):
        """``data``: the clients' data, for a strategy whose hooks compute on it (a client's
        scores of the cluster models, its class centres); the defaults never read it."""
        self.cfg, self.data = cfg, data

    def init_server(self, model: nn.Module) -> dict[str, Tensors]:
        return {"global": model_state(model)}

    def local_objective(self, loss: LossFn, model: nn.Module) -> LossFn:
        """The clients' objective around the method's ``loss`` on ``model`` (FedProx adds its
        proximal term); a method builds its cohort trainer with it. Default: ``loss``."""
        return loss

    def sample(self, state: FedState, round_: int) -> list[int]:
        return sample_clients(state.num_clients, self.cfg.client_fraction, self.cfg.seed, round_)

    def lr(self, round_: int) -> float:
        if self.cfg.lr_schedule == "cosine":
            return cosine_lr(self.cfg.lr, round_, self.cfg.rounds)
        return self.cfg.lr

    def download(self, state: FedState, client: int) -> Tensors:
        return state.server["global"]

    def local_start(self, state: FedState, client: int, received: Tensors) -> Tensors:
        return {**received, **state.clients.get(client, {})}

    def group(self, state: FedState, client: int) -> int:
        return 0

    def trainable(self, state: FedState) -> set[str] | None:
        return None  # every parameter

    def upload(self, state: FedState, client: int, trained: Tensors) -> Tensors:
        """What the client sends. ``trained`` may be views of a buffer the next client's
        training overwrites (clients trained one at a time share one row): the round reads the
        upload at once; a strategy that stores tensors from it clones them, as ``keep``'s are."""
        return trained

    def traffic(self, tensors: Tensors) -> dict[str, Tensors]:
        """What a download or upload holds, by kind: the ledger counts each kind apart (e.g.
        encoder blocks and heads). Default: one kind, ``model``."""
        return {"model": tensors}

    def keep(self, state: FedState, client: int, trained: Tensors) -> Tensors | None:
        return None  # nothing persists on the client

    def needs_uploads(self) -> bool:
        """Whether ``aggregate`` reads each client's upload. If not (FedAvg: only their
        data-size weighted mean), the trainer sums the uploads as the clients finish
        (``RoundUpdates.mean``) and a round holds one model's worth of sums, not one model per
        client. Any strategy that overrides ``aggregate`` (in a subclass, or on the instance)
        gets every upload (the stacked path), unless it says otherwise here."""
        return getattr(self.aggregate, "__func__", None) is not Strategy.aggregate

    def aggregate(self, state: FedState, updates: RoundUpdates) -> None:
        state.server["global"] = self.mean(updates)

    @staticmethod
    def mean(updates: RoundUpdates) -> Tensors:
        """The uploads' data-size weighted mean (FedAvg): as the round summed them when it
        streamed (a strategy whose ``needs_uploads`` is False), else from every upload."""
        if updates.mean is not None:
            return updates.mean
        return fedavg(stacked(updates.uploads), updates.weights)

    def server_step(self, state: FedState, round_: int) -> None:
        pass

    def evaluate(self, state: FedState, round_: int) -> dict | None:
        """Metrics of the round just finished for the round log (e.g. the clients' mean
        personalised accuracy); per-client records go into ``state.memo``."""
        return None

    def final_model(self, state: FedState) -> Tensors:
        """The state to load into the model at the end (for methods with one global model)."""
        return state.server["global"]

    def load_final(self, model: nn.Module, state: FedState) -> None:
        """Load the final model into ``model`` (the module the federation was built on): by
        default its state dict is the final model; a strategy whose final model comes in
        parts loads each where it belongs."""
        model.load_state_dict(self.final_model(state))


def first_start(strategy: Strategy, model: nn.Module) -> Tensors:
    """What a client's first local training starts from, before any round (the model as the
    server holds it, with what the strategy adds, such as FedProx's anchors): the state a
    cost counter's probe step runs on."""
    state = FedState(0, strategy.init_server(model), {}, Ledger.empty([1]))
    return strategy.local_start(state, 0, strategy.download(state, 0))
