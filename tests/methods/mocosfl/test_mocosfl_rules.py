"""MocoSFL / MonAcoSFL rules no other test pins (spec methods/monacosfl.md): every step moves
the momentum models by EMA of the online ones as they were before the step; when the
misalignment log reads the models (every logged step after it, and around every sync, over the
clients of the round); the k-NN monitor (which model, which rounds, which number)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedssl.data.augment import to_float
from fedssl.fl.cohort import stack
from fedssl.fl.momentum import FeatureQueue, misalignment
from fedssl.methods.mocosfl.split import KnnMonitor, SplitEncoder, unprefixed
from tests.methods.mocosfl.test_mocosfl import federation, params, toy_data

pytestmark = pytest.mark.usefixtures("one_thread")


def test_each_step_moves_every_momentum_model_by_ema_of_its_pre_step_online_model(tmp_path):
    """Clients and server: xi <- m xi + (1 - m) phi with phi the online weights before this
    step's SGD update (m = 0.9 here), while the online weights themselves move."""
    p = params("mocosfl", moco=dict(queue_size=32, symmetric=False, momentum=0.9))
    data = toy_data()
    fed = federation(p, tmp_path, data, parallel=False)
    state = fed.start(None)
    g = torch.Generator().manual_seed(0)

    def moved(tensors):
        return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in tensors.items()}

    init = state.server["client_init"]
    online, momentum = stack([moved(init), moved(init)]), stack([init, init])
    server = {k: v.unsqueeze(0) for k, v in moved(state.server["server"]).items()}
    server_m = {k: v.clone() for k, v in state.server["server_momentum"].items()}
    before = [{k: v.clone() for k, v in d.items()} for d in (online, momentum, server, server_m)]
    opt = {"step": torch.zeros(2), "m": {k: torch.zeros_like(v) for k, v in online.items()}}
    server_opt = {"step": torch.zeros(1), "m": {k: torch.zeros_like(v) for k, v in server.items()}}
    idx = np.stack([data.clients[0][:6], data.clients[1][:6]])
    fed.trainer.step(
        state,
        [0, 1],
        [0, 1],
        idx,
        np.ones_like(idx, dtype=bool),
        data,
        online,
        momentum,
        opt,
        server,
        server_m,
        server_opt,
        FeatureQueue(32, 8, 1),
        torch.Generator().manual_seed(1),
        0.1,
    )
    on0, mom0, top0, top_m0 = before
    for k in online:
        assert torch.allclose(momentum[k], 0.9 * mom0[k] + 0.1 * on0[k], atol=1e-6), k
    for k in server:
        assert torch.allclose(server_m[k], 0.9 * top_m0[k] + 0.1 * top0[k][0], atol=1e-6), k
    assert not torch.equal(online["0.0.weight"], on0["0.0.weight"])


def spy_models(fed, record):
    """``record(online, momentum)`` of the round's stacked client models right after every step
    (before its sync) and right after every sync, called on the trainer's own tensors."""
    after_step, after_sync = [], []
    step, sync = fed.trainer.step, fed.strategy.sync

    def spy_step(state, clients, rows, idx, valid, data, online, momentum, *rest):
        loss = step(state, clients, rows, idx, valid, data, online, momentum, *rest)
        after_step.append(record(online, momentum))
        return loss

    def spy_sync(state, clients, online, momentum, weights):
        sync(state, clients, online, momentum, weights)
        after_sync.append(record(online, momentum))

    fed.trainer.step, fed.strategy.sync = spy_step, spy_sync
    return after_step, after_sync


def spy_misalignment(fed):
    """Eq. 2 (absolute and squared) of the round's stacked clients after every step and sync."""
    return spy_models(
        fed,
        lambda online, momentum: (
            float(misalignment([online], [momentum])),
            float(misalignment([online], [momentum], squared=True)),
        ),
    )


@pytest.mark.parametrize("variant", ["mocosfl", "monacosfl"])
def test_the_misalignment_log_reads_the_models_before_and_after_each_sync(tmp_path, variant):
    """Sync every 2 steps, a row every 3rd step and at every sync: the pre-sync value is the
    models after the step, before the sync; the logged value (and its square) after the sync,
    or after the step where none happened; with 2 of 3 clients a round, only theirs count."""
    p = params(variant, training=dict(rounds=2, sync_every=2, log_every=3, client_fraction=0.67))
    fed = federation(p, tmp_path)
    after_step, after_sync = spy_misalignment(fed)
    state = fed.run(fed.start(None))
    log = state.memo["steps"]
    syncs = iter(after_sync)
    expected = []
    for step, (mis, sq) in enumerate(after_step, 1):
        synced = any(e["step"] == step and e["sync"] for e in log)
        if synced:
            post, post_sq = next(syncs)
            expected.append((step, 1, mis, post, post_sq))
        elif step % 3 == 0:
            expected.append((step, 0, "", mis, sq))
    assert next(syncs, None) is None and len(after_sync) >= 3
    assert [
        (e["step"], e["sync"], e["misalignment_pre_sync"], e["misalignment"], e["misalignment_sq"])
        for e in log
    ] == expected
    assert all(e["misalignment_pre_sync"] != e["misalignment"] for e in log if e["sync"])


def test_the_knn_monitor_scores_the_latest_synced_model_on_schedule(tmp_path):
    """Every 2nd round and the last (rounds 2, 3): weighted k-NN (k = 3, votes exp(s / T))
    of the queries among the bank, on the backbone features of the latest synced client part
    and the server's backbone: computed here by hand with the deployed encoder."""
    data = toy_data()
    labels = data.labels.numpy()
    bank, queries = np.arange(40), np.arange(40, 60)
    # a third of the bank mislabelled: which neighbours come first decides the score
    bank_labels = (labels[bank] + (bank % 3 == 0)) % 4
    monitor = KnnMonitor(
        data.images[bank],
        bank_labels,
        data.images[queries],
        labels[queries],
        k=3,
        temperature=0.1,
        every=2,
    )
    p = params("mocosfl", training=dict(rounds=3, sync_every=2))
    fed = federation(p, tmp_path)
    fed.strategy.monitor = monitor
    state = fed.start(None)
    seen = []
    while state.round < 3:
        fed.run_round(state)
        seen.append({k: v.clone() for k, v in state.server["sync"].items()})
    assert [r["round"] for r in state.log if "knn_monitor" in r] == [2, 3]

    deployed = SplitEncoder(
        fed.strategy.nets, unprefixed(seen[-1], "online"), state.server["server"]
    ).eval()
    with torch.no_grad():
        f_bank = F.normalize(deployed(to_float(data.images[bank])), dim=1)
        f_query = F.normalize(deployed(to_float(data.images[queries])), dim=1)
    hits = 0
    for q, y in zip(f_query, labels[queries]):
        sim, idx = (f_bank @ q).topk(3)
        votes = np.zeros(4)
        np.add.at(votes, bank_labels[idx.numpy()], np.exp(sim.numpy() / 0.1))
        hits += int(votes.argmax() == y)
    assert state.log[-1]["knn_monitor"] == pytest.approx(round(100 * hits / len(queries), 2))


def recording(forward, seen: list):
    """``forward`` (the clients' forward pass) keeping a copy of every input in ``seen``."""

    def call(weights, x):
        seen.append(x.clone())
        return forward(weights, x)

    return call


def test_the_symmetric_loss_queries_both_views_against_the_other_one(tmp_path):
    """V2's symmetric loss: the online models see [x'; x''], the momentum models [x''; x'],
    so each query's positive key is the other view of its image; without it, x' against x''."""
    for symmetric in (True, False):
        p = params("mocosfl", moco=dict(queue_size=32, symmetric=symmetric))
        fed = federation(p, tmp_path, name=f"{symmetric}.pt")
        seen = []
        fed.trainer.client_forward = recording(fed.trainer.client_forward, seen)
        fed.trainer.make_views = lambda x, g: (to_float(x), 1 - to_float(x))
        fed.run_round(fed.start(None))
        queries, keys = seen[0], seen[1]  # the first step: online, then momentum forward
        v1 = queries[:, :6]
        assert torch.equal(keys[:, :6], 1 - v1)
        if symmetric:
            assert torch.equal(queries[:, 6:], 1 - v1) and torch.equal(keys[:, 6:], v1)
        else:
            assert queries.shape[1] == keys.shape[1] == 6


@pytest.mark.parametrize("variant", ["mocosfl", "monacosfl"])
def test_a_client_that_missed_syncs_starts_from_the_latest_synced_model(tmp_path, variant):
    """A sync reaches every client: one that sat out syncs (or never trained) starts its next
    round from the latest average (MonAcoSFL: also the averaged momentum model), not from what
    it holds; MocoSFL keeps its own momentum model."""
    p = params(variant, training=dict(rounds=3, client_fraction=0.34))
    fed = federation(p, tmp_path)
    state = fed.start(None)
    starts = []
    client_start = fed.strategy.client_start

    def spy(state_, c):
        kept = state_.clients.get(c)
        init = state_.server["client_init"]
        seen_sync = int(kept["sync_id"]) if kept is not None else 0
        start = client_start(state_, c)
        if seen_sync < int(state_.server["sync"]["count"]):
            held = (
                (init, init)
                if kept is None
                else (unprefixed(kept, "online"), unprefixed(kept, "momentum"))
            )
            starts.append((*held, {k: v.clone() for k, v in state_.server["sync"].items()}, start))
        return start

    fed.strategy.client_start = spy
    fed.run(state)
    assert starts, "no client came back after missing a sync"
    for kept_online, kept_momentum, sync, start in starts:
        for k, v in unprefixed(sync, "online").items():
            assert torch.equal(start["online"][k], v), k
        assert not torch.equal(kept_online["0.0.weight"], start["online"]["0.0.weight"])
        momentum = unprefixed(sync, "momentum") if variant == "monacosfl" else kept_momentum
        for k, v in momentum.items():
            assert torch.equal(start["momentum"][k], v), k
