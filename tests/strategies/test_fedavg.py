"""FedAvg: the weighted mean, summed as the clients finish with the very bits of the stacked
mean, and a round that keeps no client's model once it is added."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch

from fedssl.fl.cohort import LocalData
from fedssl.fl.state import model_state, nbytes
from fedssl.strategies.aggregation import RunningMean, fedavg
from fedssl.strategies.base import Strategy
from fedssl.strategies.fedavg import FedAvg
from tests.fl.test_engine import ReadsEveryUpload, make_fed, tiny_model, toy_data


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


@pytest.mark.parametrize("clients", [1, 2, 7, 300, 1000])
def test_running_mean_is_fedavg_of_the_stack_bit_for_bit(clients):
    """Every dtype and size a model holds: matrices (with negative zeros), a scalar, an
    integer counter, a float64 tensor; the sums equal the stacked mean in every bit."""
    g = torch.Generator().manual_seed(clients)
    stack = {
        "conv": torch.randn(clients, 8, 3, 3, 3, generator=g),
        "bias": torch.randn(clients, 8, generator=g).clamp(max=0) * 0.0,  # -0.0 and 0.0
        "alpha": torch.rand(clients, generator=g),  # numel 1: a dot product, kept apart
        "count": torch.randint(0, 9, (clients,), generator=g),
        "double": torch.randn(clients, 5, dtype=torch.float64, generator=g),
    }
    weights = torch.randint(1, 900, (clients,), generator=g).double()
    running = RunningMean(weights)
    for i in range(clients):
        running.add({k: v[i] for k, v in stack.items()})
    got, want = running.result(), fedavg(stack, weights)
    assert list(got) == list(stack)
    for k in stack:
        assert torch.equal(bits(got[k]), bits(want[k])), k


def held(running: RunningMean) -> int:
    """The bytes a running mean holds: its sums, maxima and kept rows."""
    rows = [t for r in running.rows.values() for t in r]
    return nbytes(running.sums) + nbytes(running.maxima) + sum(t.nbytes for t in rows)


def test_a_running_mean_of_a_batchnorm_model_holds_one_models_worth():
    """Weights and BatchNorm's integer batch counter: after 3 or 300 clients the sums hold the
    same bytes, one model's (a counter per client kept until the end would grow with them)."""
    upload = {"w": torch.ones(4, 3), "b": torch.ones(3), "num_batches_tracked": torch.tensor(5)}
    sizes = []
    for clients in (3, 300):
        running = RunningMean(torch.ones(clients, dtype=torch.float64))
        for i in range(clients):
            running.add({**upload, "num_batches_tracked": torch.tensor(clients - i)})
        sizes.append(held(running))
        assert running.result()["num_batches_tracked"] == clients  # the first client's
    assert sizes == [nbytes(upload)] * 2


def test_running_mean_counts_its_uploads():
    running = RunningMean(torch.tensor([1.0, 2.0], dtype=torch.float64))
    running.add({"w": torch.ones(3)})
    with pytest.raises(ValueError, match="1 uploads added, 2 weights"):
        running.result()
    running.add({"w": torch.ones(3)})
    with pytest.raises(ValueError, match="more uploads than the 2 weights"):
        running.add({"w": torch.ones(3)})


def test_only_strategies_that_keep_fedavgs_aggregate_stream():
    cfg = None
    assert not FedAvg(cfg).needs_uploads() and not Strategy(cfg).needs_uploads()
    assert ReadsEveryUpload(cfg).needs_uploads()
    patched = FedAvg(cfg)
    patched.aggregate = lambda state, updates: None  # a test's own rule on one instance
    assert patched.needs_uploads()


@pytest.mark.parametrize("parallel", [False, True])
def test_a_fedavg_round_is_the_stacked_rounds_model_and_keeps_no_upload(tmp_path, parallel):
    """One round of FedAvg streams (no upload kept, the mean in ``updates.mean``) and gives the
    model of the stacked path bit for bit, on both cohort paths."""
    data = toy_data()
    models = {}
    for strategy in (FedAvg, ReadsEveryUpload):
        model = tiny_model()
        fed = make_fed(
            model, data, tmp_path / strategy.__name__, parallel=parallel, strategy=strategy
        )
        state = fed.start(model)
        updates = fed.trainer.train_round(fed, state, [0, 1, 2], 0, 1e-3)
        assert (updates.mean is None) == (strategy is ReadsEveryUpload)
        assert len(updates.uploads) == (3 if strategy is ReadsEveryUpload else 0)
        fed.strategy.aggregate(state, updates)
        models[strategy] = state.server["global"]
    for k, v in models[ReadsEveryUpload].items():
        assert torch.equal(bits(models[FedAvg][k]), bits(v)), k


class WatchesUploads:
    """Mixed into a strategy: at each client's upload, the bytes of the client models the round
    still holds (the tensors every upload so far lives in, a cohort row's base), followed by
    weak reference so that watching keeps none of them alive."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.homes: list[weakref.ref] = []
        self.peak = 0

    def upload(self, state, client, trained):
        out = super().upload(state, client, trained)
        self.homes += [weakref.ref(v if v._base is None else v._base) for v in out.values()]
        alive = {id(t): t for t in (home() for home in self.homes) if t is not None}
        self.peak = max(self.peak, sum(t.nbytes for t in alive.values()))
        return out


class WatchedFedAvg(WatchesUploads, FedAvg):
    pass


class WatchedEveryUpload(WatchesUploads, ReadsEveryUpload):
    pass


def test_a_fedavg_round_holds_one_client_model_whatever_the_client_count(tmp_path):
    """Memory O(model), not O(clients): clients trained one at a time (the CPU's cohort), a
    FedAvg round holds one client's trained model at any time, with 3 clients as with 12,
    while a strategy that reads every upload holds all of them; both give the same model bit
    for bit. (The vectorised cohort trains every client at once, so it holds them all.)"""
    images = toy_data(n=96).images
    size = nbytes(model_state(tiny_model()))
    models = {}
    for clients in (3, 12):
        data = LocalData(images, torch.arange(96) % 3, np.array_split(np.arange(96), clients))
        for strategy in (WatchedFedAvg, WatchedEveryUpload):
            model = tiny_model()
            fed = make_fed(
                model, data, tmp_path / f"{strategy.__name__}{clients}", strategy=strategy
            )
            state = fed.start(model)
            fed.run_round(state)
            held = fed.strategy.peak
            assert held == (size if strategy is WatchedFedAvg else clients * size), (clients, held)
            models[strategy, clients] = state.server["global"]
    for clients in (3, 12):
        stacked_model = models[WatchedEveryUpload, clients]
        for k, v in models[WatchedFedAvg, clients].items():
            assert torch.equal(bits(v), bits(stacked_model[k])), (clients, k)
