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
from fedssl.eval.monitor import KnnMonitor
from fedssl.fl.cohort import stack
from fedssl.methods.mocosfl.nets import SplitEncoder
from fedssl.methods.mocosfl.sync import unprefixed
from fedssl.methods.mocosfl.trainer import RoundTensors, ServerTensors, SplitRound, StepBatch
from fedssl.models.momentum import FeatureQueue, misalignment
from fedssl.params import KnnParams
from tests.methods.mocosfl.test_mocosfl import SHAPE, federation, params, toy_data

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
    server_side = ServerTensors(server, server_m, server_opt, FeatureQueue(32, 8, 1))
    tensors = RoundTensors([0, 1], online, momentum, opt, server_side)
    fed.trainer.step(
        SplitRound(state, data, tensors, torch.Generator().manual_seed(1)),
        StepBatch([0, 1], [0, 1], idx, np.ones_like(idx, dtype=bool), 0.1),
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

    def spy_step(run, batch):
        loss = step(run, batch)
        after_step.append(record(run.tensors.online, run.tensors.momentum))
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
    p = params(variant, federation=dict(rounds=2, sync_every=2, log_every=3, client_fraction=0.67))
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
    p = params("mocosfl", federation=dict(rounds=3, sync_every=2))
    fed = federation(p, tmp_path)
    fed.monitor = KnnMonitor(
        fed.strategy.nets.embedding,
        data.images[bank],
        bank_labels,
        data.images[queries],
        labels[queries],
        every=2,
        rounds=3,
        knn=KnnParams(k=3, temperature=0.1),
    )
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


@pytest.mark.parametrize("symmetric", [True, False])
def test_each_client_sends_one_view_through_each_of_its_models(tmp_path, symmetric):
    """The online client model sees x', the momentum one x'' (B_c rows each), whether or not
    the server adds the symmetric loss: it swaps the activations, the clients send no more."""
    p = params("mocosfl", moco=dict(queue_size=32, symmetric=symmetric))
    fed = federation(p, tmp_path, name=f"{symmetric}.pt")
    seen = []
    fed.trainer.client_forward = recording(fed.trainer.client_forward, seen)
    fed.trainer.make_views = lambda x, g: (to_float(x), 1 - to_float(x))
    fed.run_round(fed.start(None))
    online_views, momentum_views = seen[0], seen[1]  # the first step: online, then momentum
    assert online_views.shape[1] == momentum_views.shape[1] == 6
    assert torch.equal(momentum_views, 1 - online_views)


def test_the_keys_clients_send_come_from_their_momentum_models(tmp_path):
    """Key activations: the momentum client model (after this step's EMA) on x''; the
    queries: the online model on x'."""
    p = params("mocosfl", moco=dict(queue_size=32, momentum=0.5))
    fed = federation(p, tmp_path)
    init = fed.start(None).server["client_init"]
    g = torch.Generator().manual_seed(3)
    online = stack([{k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in init.items()}])
    momentum = stack([init])
    x1, x2 = torch.rand(2, 1, 4, *SHAPE, generator=g)
    expected_momentum = {k: 0.5 * momentum[k] + 0.5 * online[k] for k in online}
    h_q, h_k = fed.trainer._client_forwards(online, online, momentum, x1, x2)
    assert torch.allclose(h_k, fed.trainer.client_forward(expected_momentum, x2), atol=1e-6)
    assert not torch.allclose(h_k, fed.trainer.client_forward(online, x2), atol=1e-3)
    assert torch.equal(h_q, fed.trainer.client_forward(online, x1))


class AuthorsServer:
    """A transcription of the authors' server step (``create_sflmocoserver_instance`` of their
    ``sflmoco_functions.py``: ``compute`` and ``contrastive_loss``; one shared queue, the batch
    shuffle left out: GroupNorm has no batch statistics), on the project's server top."""

    def __init__(self, top, online, momentum, queue, temperature, symmetric):
        import copy

        self.model = copy.deepcopy(top)
        self.model.load_state_dict(online)
        self.t_model = copy.deepcopy(top)
        self.t_model.load_state_dict(momentum)
        self.queue, self.ptr = queue.keys.T.clone(), queue.ptr  # [d, K], as theirs
        self.T, self.symmetric = temperature, symmetric

    def contrastive_loss(self, query, pkey):
        query_out = F.normalize(self.model(query), dim=1)
        with torch.no_grad():
            pkey_out = F.normalize(self.t_model(pkey), dim=1).detach()
        l_pos = torch.einsum("nc,nc->n", [query_out, pkey_out]).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", [query_out, self.queue.clone().detach()])
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        return F.cross_entropy(logits, labels), query_out, pkey_out

    def compute(self, query, pkey, tau):
        query.requires_grad = True
        query.retain_grad()
        with torch.no_grad():
            for online, target in zip(self.model.parameters(), self.t_model.parameters()):
                target.data = tau * target.data + (1 - tau) * online.data
        if self.symmetric:
            loss12, _, k2 = self.contrastive_loss(query, pkey)
            loss21, _, k1 = self.contrastive_loss(pkey, query)
            loss, keys = loss12 + loss21, torch.cat([k1, k2], dim=0)
        else:
            loss, _, keys = self.contrastive_loss(query, pkey)
        with torch.no_grad():
            n = keys.shape[0]
            self.queue[:, self.ptr : self.ptr + n] = keys.T  # the test's pushes do not wrap
            self.ptr = (self.ptr + n) % self.queue.shape[1]
        loss.backward()
        return loss.detach(), query.grad.detach().clone()


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_servers_step_is_the_authors_compute(tmp_path, symmetric):
    """On the same activations, weights and queue: the loss (loss12 + loss21 when symmetric),
    the gradient returned to the clients (loss12's only: the online activations enter loss21 as
    keys), the server's SGD step (torch's SGD, as theirs), its momentum copy and the queue
    (the keys of the online activations first) equal the authors' step."""
    p = params("mocosfl", moco=dict(queue_size=32, symmetric=symmetric, momentum=0.9))
    fed = federation(p, tmp_path)
    state, top, t = fed.start(None), fed.strategy.nets.top, p.federation
    g = torch.Generator().manual_seed(5)
    shape = (2, 5, *fed.strategy.nets.activation_shape(SHAPE))
    h_q, h_k = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    online = {
        k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in state.server["server"].items()
    }
    momentum = state.server["server_momentum"]
    queue = FeatureQueue(32, 8, 1)
    queue.ptr = 3
    theirs = AuthorsServer(top, online, momentum, queue, p.moco.temperature, symmetric)
    their_opt = torch.optim.SGD(
        theirs.model.parameters(), lr=0.1, momentum=t.momentum, weight_decay=t.weight_decay
    )
    their_loss, their_grad = theirs.compute(h_q.flatten(0, 1).clone(), h_k.flatten(0, 1), 0.9)
    their_opt.step()

    server = {k: v.unsqueeze(0).clone() for k, v in online.items()}
    server_m = {k: v.clone() for k, v in momentum.items()}
    server_opt = {"step": torch.zeros(1), "m": {k: torch.zeros_like(v) for k, v in server.items()}}
    valid = torch.ones(shape[:2], dtype=torch.bool)
    server_side = ServerTensors(server, server_m, server_opt, queue)
    loss, grad = fed.trainer._server_step(h_q, h_k, valid, server_side, 0.1)
    assert float(loss.detach()) == pytest.approx(float(their_loss), abs=1e-5)
    torch.testing.assert_close(grad.flatten(0, 1), their_grad, rtol=1e-4, atol=1e-7)
    for name, w in theirs.model.named_parameters():
        torch.testing.assert_close(server[name][0], w.detach(), rtol=1e-4, atol=1e-6)
    for name, w in theirs.t_model.named_parameters():
        torch.testing.assert_close(server_m[name], w.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(queue.keys, theirs.queue.T, rtol=0, atol=1e-6)
    assert queue.ptr == theirs.ptr == 3 + (2 if symmetric else 1) * 10


@pytest.mark.parametrize("variant", ["mocosfl", "monacosfl"])
def test_a_client_that_missed_syncs_starts_from_the_latest_synced_model(tmp_path, variant):
    """A sync reaches every client: one that sat out syncs (or never trained) starts its next
    round from the latest average (MonAcoSFL: also the averaged momentum model), not from what
    it holds; MocoSFL keeps its own momentum model."""
    p = params(variant, federation=dict(rounds=3, client_fraction=0.34))
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
