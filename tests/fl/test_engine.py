"""The federated engine: FedAvg, byte accounting, sampling, resume, vectorised clients, and the
hooks the coming methods build on (model pools, personal state, trainable subsets, labels in
losses, a server step with server data, a trainer of its own such as split learning)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedssl.data.augment import to_float
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig, on_outputs
from fedssl.fl.state import (
    FederationConfig,
    FedState,
    Ledger,
    RoundUpdates,
    model_state,
    nbytes,
    sample_clients,
)
from fedssl.losses import simclr_views
from fedssl.models.encoders import ContrastiveModel
from fedssl.params import ModelParams
from fedssl.rounds.loop import Federation, LocalTraining
from fedssl.strategies.aggregation import fedavg, stacked
from fedssl.strategies.base import Strategy

SHAPE = (1, 28, 28)


def simclr_loss(temperature: float):
    """FedSimCLR's cohort loss at ``temperature`` (the method's own loss, on its outputs)."""
    return on_outputs(
        lambda z, batch: simclr_views(z, batch, SimpleNamespace(temperature=temperature))
    )


def tiny_model(norm: str = "gn", seed: int = 0) -> ContrastiveModel:
    torch.manual_seed(seed)
    return ContrastiveModel(
        ModelParams(
            arch="small_cnn", norm=norm, channels_per_group=4, width=4, proj_hidden=16, proj_dim=8
        ),
        SHAPE,
    )


def toy_data(n: int = 90, seed: int = 0) -> LocalData:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, *SHAPE), dtype=torch.uint8, generator=g)
    labels = torch.arange(n) % 3
    clients = [np.arange(0, 20), np.arange(20, 50), np.arange(50, 90)]  # unequal sizes
    return LocalData(images, labels, clients)


def noisy_views(batch, generator):
    """Two views that differ by seeded noise (cheap, deterministic given the generator)."""
    x = to_float(batch)
    return (
        x + 0.05 * torch.randn(x.shape, generator=generator),
        x + 0.05 * torch.randn(x.shape, generator=generator),
    )


def identity_views(batch, generator):
    x = to_float(batch)
    return x, x.flip(-1)


def make_fed(
    model,
    data,
    tmp_path,
    rounds=3,
    parallel=False,
    fraction=1.0,
    views=noisy_views,
    strategy=Strategy,
    loss=None,
    opt="adam",
    lr=1e-3,
):
    cohort = make_cohort(model, views, loss, opt, parallel)
    cfg = FederationConfig(rounds=rounds, client_fraction=fraction, lr=lr, seed=0)
    return Federation(strategy(cfg), LocalTraining(cohort), data, cfg, tmp_path / "ckpt.pt", "fp")


def make_cohort(model, views=noisy_views, loss=None, opt="adam", parallel=False):
    return CohortTrainer(
        model,
        views,
        loss or simclr_loss(0.5),
        OptimizerConfig(opt),
        batch_size=16,
        local_epochs=1,
        parallel=parallel,
    )


def test_fedavg_weights_by_data_size_and_keeps_integer_buffers():
    stacked_ = {"w": torch.tensor([[1.0, 2.0], [3.0, 6.0]]), "n": torch.tensor([4, 7])}
    avg = fedavg(stacked_, torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert torch.allclose(avg["w"], torch.tensor([2.5, 5.0]))
    assert avg["n"].item() == 7


def test_uploads_that_are_the_cohorts_rows_aggregate_without_a_second_copy():
    """A round holds one copy of the cohort's models: uploads that are the rows of its output,
    in order, are that tensor; any other uploads are stacked (copied) as before."""
    cohort = torch.randn(3, 4, 5)
    rows = [{"w": cohort[i]} for i in range(3)]
    whole = stacked(rows)["w"]
    assert whole is cohort and torch.equal(whole, torch.stack([r["w"] for r in rows]))
    for other in (rows[::-1], rows[:2], [{"w": r["w"].clone()} for r in rows]):
        again = stacked(other)["w"]
        assert again.data_ptr() != cohort.data_ptr()
        assert torch.equal(again, torch.stack([r["w"] for r in other]))


class ReadsEveryUpload(Strategy):
    """FedAvg through an ``aggregate`` of its own: the stacked path (every upload kept)."""

    def aggregate(self, state, updates):
        super().aggregate(state, updates)


@pytest.mark.parametrize("parallel", [False, True])
def test_a_rounds_uploads_reach_aggregation_as_the_cohorts_own_tensor(tmp_path, parallel):
    """The round itself, not just `stacked`: for a strategy that reads every upload, the
    uploads of either cohort path are the rows of one stacked result, so aggregation reads
    that tensor without copying it. (FedAvg's own round sums them as they come instead:
    tests/strategies/test_fedavg.py.)"""
    data, model = toy_data(), tiny_model()
    fed = make_fed(model, data, tmp_path, parallel=parallel, strategy=ReadsEveryUpload)
    state = fed.start(model)
    updates = fed.trainer.train_round(fed, state, [0, 1, 2], 0, 1e-3)
    for k, whole in stacked(updates.uploads).items():
        assert whole.data_ptr() == updates.uploads[0][k].data_ptr(), k
        assert torch.equal(whole, torch.stack([u[k] for u in updates.uploads]))


def test_client_sampling_by_fraction_is_seeded():
    a = sample_clients(10, 0.3, seed=1, round_=5)
    assert len(a) == 3 and a == sample_clients(10, 0.3, seed=1, round_=5)
    assert len({tuple(sample_clients(10, 0.3, 1, r)) for r in range(10)}) > 1


def test_a_strategy_reads_the_state_it_is_handed_not_the_loop_that_drives_it():
    """No back-reference: sampling needs no federation, the state says how many clients."""
    cfg = FederationConfig(rounds=9, client_fraction=0.3, lr=0.1, seed=1)
    state = FedState(5, {}, {}, Ledger.empty([4] * 10))
    assert state.num_clients == 10
    assert Strategy(cfg).sample(state, 5) == sample_clients(10, 0.3, seed=1, round_=5)
    assert not hasattr(Strategy(cfg), "fed")


def test_a_federation_refuses_a_strategy_built_on_other_client_data(tmp_path):
    cfg = FederationConfig(rounds=1, client_fraction=1.0, lr=0.1)
    data, cohort = toy_data(), LocalTraining(make_cohort(tiny_model()))
    Federation(Strategy(cfg, data), cohort, data, cfg, tmp_path / "a.pt", "fp")  # its own: fine
    with pytest.raises(ValueError, match="other client data"):
        Federation(Strategy(cfg, toy_data(seed=1)), cohort, data, cfg, tmp_path / "b.pt", "fp")


def test_rounds_train_and_account_bytes(tmp_path):
    data = toy_data()
    model = tiny_model()
    initial = model_state(model)
    fed = make_fed(model, data, tmp_path, rounds=3, fraction=2 / 3)
    state = fed.run(fed.start(model))
    state_bytes = nbytes(initial)
    assert state.round == 3 and len(state.log) == 3
    assert all(row["clients"] == 2 for row in state.log)
    assert sum(state.ledger.rounds) == 6
    summary = state.ledger.summary()["per_client"]
    for row, r in zip(summary, state.ledger.rounds):
        assert row["bytes_up"] == row["bytes_down"] == r * state_bytes
    assert sum(row["bytes_up"] for row in state.log) == 6 * state_bytes
    key = "backbone.0.0.weight"
    assert not torch.equal(state.server["global"][key], initial[key])


def test_killed_run_resumes_to_the_same_result(tmp_path):
    data = toy_data()
    full_model = tiny_model()
    (tmp_path / "a").mkdir()
    full = make_fed(full_model, data, tmp_path / "a", rounds=3)
    uninterrupted = full.run(full.start(full_model))

    (tmp_path / "b").mkdir()
    model = tiny_model()
    fed = make_fed(model, data, tmp_path / "b", rounds=3)

    def kill_after_round_2(state):
        if state.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fed.run(fed.start(model), on_round=kill_after_round_2)
    fresh = tiny_model(seed=123)  # a new process would rebuild the model; the checkpoint wins
    again = make_fed(fresh, data, tmp_path / "b", rounds=3)
    start = again.start(fresh)
    assert start.round == 2
    resumed = again.run(start)
    for k, v in uninterrupted.server["global"].items():
        assert torch.equal(v, resumed.server["global"][k]), k
    assert uninterrupted.ledger == resumed.ledger
    assert [r["loss"] for r in uninterrupted.log] == [r["loss"] for r in resumed.log]


def test_checkpoint_of_other_params_is_ignored(tmp_path):
    data = toy_data()
    model = tiny_model()
    fed = make_fed(model, data, tmp_path, rounds=1)
    fed.run(fed.start(model))
    fed.fingerprint = "other params"
    assert fed.start(model).round == 0


def test_checkpoints_hold_only_tensors_and_plain_values(tmp_path):
    """A checkpoint loads with weights_only=True: no arbitrary unpickling."""
    data = toy_data()
    model = tiny_model()
    fed = make_fed(model, data, tmp_path, rounds=1)
    fed.run(fed.start(model))
    ck = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ck["state"]["round"] == 1 and "global" in ck["state"]["server"]


def cohort_of(model, loss, parallel, opt="sgd", epochs=2, views=identity_views):
    return CohortTrainer(
        model,
        views,
        loss,
        OptimizerConfig(opt),
        batch_size=16,
        local_epochs=epochs,
        parallel=parallel,
    )


def test_vectorised_clients_match_one_by_one():
    """Same batches, same result. SGD keeps float noise at float size (Adam's first steps move a
    near-zero-gradient weight by +-lr whatever the sign noise, so it cannot be compared tightly);
    clients of unequal sizes exercise the padded, partly-active steps."""
    data = toy_data()
    model = tiny_model()
    start = model_state(model)
    results = {}
    for parallel in (True, False):
        trainer = cohort_of(model, simclr_loss(0.5), parallel)
        assert trainer.parallel == parallel
        results[parallel] = trainer.train(
            [start] * 3, data, [0, 1, 2], 0.05, (0, "local", 0), torch.Generator().manual_seed(0)
        )
    (p_par, loss_par), (p_seq, loss_seq) = results[True], results[False]
    assert torch.allclose(loss_par, loss_seq, atol=1e-5)
    for k in p_par:
        assert torch.allclose(p_par[k], p_seq[k], atol=2e-5), k
    # the clients really trained apart: their weights differ from each other
    assert not torch.allclose(p_par["head.2.weight"][0], p_par["head.2.weight"][2])


def test_batchnorm_models_train_one_by_one_and_average_running_stats():
    data = toy_data()
    model = tiny_model(norm="bn")
    trainer = cohort_of(model, simclr_loss(0.5), True, epochs=1, views=noisy_views)
    assert not trainer.parallel  # BN running statistics rule out vmap
    b, _ = trainer.train(
        [model_state(model)] * 3, data, [0, 1, 2], 0.1, (0,), torch.Generator().manual_seed(0)
    )
    key = "backbone.0.1.running_mean"
    assert not torch.allclose(b[key][0], b[key][1])  # each client saw its own batches
    sizes = torch.tensor([20.0, 30.0, 40.0], dtype=torch.float64)
    expected = (b[key] * (sizes / sizes.sum()).float()[:, None]).sum(0)
    assert torch.allclose(fedavg(b, sizes)[key], expected, atol=1e-6)


def test_twin_norm_autoencoder_clients_vectorise_like_one_by_one():
    """MFCL phase 1: Twin-Norm client modules train together under vmap, padded pairs and all."""
    from fedssl.methods.mfcl.run import autoencoder_loss
    from fedssl.models.autoencoder import ClientAutoencoder

    data = toy_data()
    torch.manual_seed(0)
    model = ClientAutoencoder("resnet18", in_channels=1, width=8, norm="tn", channels_per_group=4)
    start = model_state(model)
    results = {}
    for parallel in (True, False):
        trainer = cohort_of(model, autoencoder_loss(), parallel, epochs=1)
        results[parallel] = trainer.train(
            [start] * 3, data, [0, 1, 2], 0.1, (0,), torch.Generator().manual_seed(0)
        )
    for k in start:
        assert torch.allclose(results[True][0][k], results[False][0][k], atol=2e-5), k
    assert torch.allclose(results[True][1], results[False][1], atol=1e-5)


# ------------------------------------------------------------------ hooks
def test_each_client_starts_from_its_own_state_under_vmap_too():
    """Per-client starting parameters (a model pool, a personal head): stacked starts train
    exactly as each client alone."""
    data = toy_data()
    model = tiny_model()
    starts = [model_state(tiny_model(seed=s)) for s in (1, 2, 3)]
    results = [
        cohort_of(model, simclr_loss(0.5), p).train(
            starts, data, [0, 1, 2], 0.05, (0,), torch.Generator().manual_seed(0)
        )
        for p in (1, 0)
    ]
    for k in starts[0]:
        assert torch.allclose(results[0][0][k], results[1][0][k], atol=2e-5), k
    # client 2 in the cohort trained exactly as client 2 alone from its own start
    alone, _ = cohort_of(model, simclr_loss(0.5), False).train(
        [starts[2]], data, [2], 0.05, (0,), torch.Generator().manual_seed(0)
    )
    for k in starts[0]:
        assert torch.allclose(results[1][0][k][2], alone[k][0], atol=1e-6), k


class PoolStrategy(Strategy):
    """IFCA in miniature: two models on the server; client c trains model c % 2 (its group),
    downloads the whole pool, and the server averages each model over its group only."""

    def init_server(self, model):
        base = model_state(model)
        return {
            "pool0": base,
            "pool1": {k: v + 1.0 if v.is_floating_point() else v for k, v in base.items()},
        }

    def download(self, state, client):
        return {f"{m}.{k}": v for m in ("pool0", "pool1") for k, v in state.server[m].items()}

    def group(self, state, client):
        return client % 2

    def local_start(self, state, client, received):
        prefix = f"pool{client % 2}."
        return {k[len(prefix) :]: v for k, v in received.items() if k.startswith(prefix)}

    def aggregate(self, state, updates: RoundUpdates):
        for g in set(updates.groups):
            rows = [i for i, x in enumerate(updates.groups) if x == g]
            state.server[f"pool{g}"] = fedavg(
                stacked([updates.uploads[i] for i in rows]), updates.weights[rows]
            )

    def final_model(self, state):
        return state.server["pool0"]


def test_a_model_pool_sends_every_model_and_averages_within_groups(tmp_path):
    data = toy_data()
    model = tiny_model()
    fed = make_fed(model, data, tmp_path, rounds=1, strategy=PoolStrategy, views=identity_views)
    before = fed.start(model)
    pool1 = {k: v.clone() for k, v in before.server["pool1"].items()}
    state = fed.run(before)
    one_model = nbytes(model_state(model))
    for row in state.ledger.summary()["per_client"]:
        assert row["bytes_down"] == 2 * one_model and row["bytes_up"] == one_model
    # pool1 is the average of client 1 alone (the only odd client), trained from pool1
    trainer = fed.trainer.cohort
    alone, _ = trainer.train(
        [pool1], data, [1], 1e-3, (0, "local", 0), torch.Generator().manual_seed(0)
    )
    for k, v in alone.items():
        assert torch.allclose(state.server["pool1"][k], v[0].to(pool1[k].dtype), atol=1e-6), k
    key = "head.2.weight"
    assert not torch.equal(state.server["pool1"][key], pool1[key])


class PersonalHead(Strategy):
    """FedPer / MpFedcon in miniature: the backbone is shared, the head stays on the client
    (trained, kept across rounds, never uploaded)."""

    def download(self, state, client):
        return {k: v for k, v in state.server["global"].items() if not k.startswith("head.")}

    def local_start(self, state, client, received):
        head = state.clients.get(client) or {
            k: v for k, v in state.server["global"].items() if k.startswith("head.")
        }
        return {**received, **head}

    def upload(self, state, client, trained):
        return {k: v for k, v in trained.items() if not k.startswith("head.")}

    def keep(self, state, client, trained):
        return {k: v for k, v in trained.items() if k.startswith("head.")}

    def aggregate(self, state, updates):
        shared = fedavg(stacked(updates.uploads), updates.weights)
        state.server["global"] = {**state.server["global"], **shared}


def test_personal_heads_stay_on_the_clients_and_persist_through_a_resume(tmp_path):
    data = toy_data()
    model = tiny_model()
    full = model_state(model)
    fed = make_fed(model, data, tmp_path, rounds=2, strategy=PersonalHead)
    state = fed.run(fed.start(model))
    backbone = nbytes({k: v for k, v in full.items() if not k.startswith("head.")})
    for row in state.ledger.summary()["per_client"]:
        assert row["bytes_up"] == row["bytes_down"] == 2 * backbone
    heads = [state.clients[c]["head.2.weight"] for c in range(3)]
    assert not torch.allclose(heads[0], heads[1])  # each client kept its own
    assert torch.equal(state.server["global"]["head.2.weight"], full["head.2.weight"])
    ck = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert torch.equal(ck["state"]["clients"][1]["head.2.weight"], heads[1])


class FrozenBackbone(Strategy):
    def trainable(self, state):
        return {k for k in state.server["global"] if k.startswith("head.")}

    def upload(self, state, client, trained):
        return {k: v for k, v in trained.items() if k.startswith("head.")}

    def aggregate(self, state, updates):
        state.server["global"] = {
            **state.server["global"],
            **fedavg(stacked(updates.uploads), updates.weights),
        }


def test_only_the_trainable_subset_trains_and_travels(tmp_path):
    data = toy_data()
    model = tiny_model()
    before = model_state(model)
    state = make_fed(model, data, tmp_path, rounds=1, strategy=FrozenBackbone).run(
        make_fed(model, data, tmp_path, rounds=1, strategy=FrozenBackbone).start(model)
    )
    after = state.server["global"]
    for k, v in before.items():
        if k.startswith("backbone."):
            assert torch.equal(after[k], v), k  # bit-identical: frozen
    assert not torch.equal(after["head.2.weight"], before["head.2.weight"])
    head = nbytes({k: v for k, v in before.items() if k.startswith("head.")})
    assert all(r["bytes_up"] == head for r in state.ledger.summary()["per_client"])


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 3))

    def forward(self, x):
        return self.net(x)


def cross_entropy(model, params, buffers, batch):
    logits = functional_call(model, (params, buffers), (batch.views[0],))
    per = F.cross_entropy(logits, batch.labels.clamp(min=0), reduction="none")
    return (per * batch.valid).sum() / batch.valid.sum()


def labelled_data() -> LocalData:
    """Three classes, each a bright band at its own rows: learnable from labels only."""
    labels = torch.arange(90) % 3
    images = torch.zeros(90, *SHAPE, dtype=torch.uint8)
    for c in range(3):
        images[labels == c, :, 8 * c : 8 * c + 6] = 200
    return LocalData(images, labels, [np.arange(0, 30), np.arange(30, 60), np.arange(60, 90)])


def accuracy(state_dict, data: LocalData) -> float:
    model = Classifier()
    model.load_state_dict(state_dict)
    with torch.no_grad():
        return (model(to_float(data.images)).argmax(1) == data.labels).float().mean().item()


def test_labels_reach_local_losses(tmp_path):
    data = labelled_data()
    model = Classifier()
    fed = make_fed(
        model,
        data,
        tmp_path,
        rounds=3,
        loss=cross_entropy,
        views=lambda b, g: (to_float(b),),
        opt="sgd",
        lr=0.5,
    )
    state = fed.run(fed.start(model))
    assert accuracy(state.server["global"], data) == 1.0
    assert state.log[-1]["loss"] < state.log[0]["loss"]


def where_labelled(model, params, buffers, batch):
    """Cross-entropy on labelled batches; nothing to learn from unlabelled ones (labels -1)."""
    return cross_entropy(model, params, buffers, batch) * (batch.labels >= 0).float().min()


class Calibrated(Strategy):
    """LW-FedSSL's calibration in miniature: after each aggregation the server trains the
    global model on its own data (``server``), with a trainer like the clients' (``cohort``)."""

    def __init__(self, cfg, cohort, server):
        super().__init__(cfg)
        self.cohort, self.server = cohort, server

    def server_step(self, state, round_):
        trained, _ = self.cohort.train(
            [state.server["global"]],
            self.server,
            [0],
            0.5,
            (0, "server", round_),
            torch.Generator().manual_seed(round_),
        )
        state.server["global"] = {k: v[0] for k, v in trained.items()}
        state.memo.setdefault("server_steps", []).append(round_)


def test_a_server_step_trains_on_server_data_after_aggregation(tmp_path):
    labelled = labelled_data()
    unlabelled = LocalData(labelled.images, torch.full((90,), -1), labelled.clients)
    server = LocalData(labelled.images, labelled.labels, [np.arange(90)])
    model = Classifier()
    plain = dict(views=lambda b, g: (to_float(b),), loss=where_labelled, opt="sgd")
    cohort = make_cohort(model, **plain)
    fed = make_fed(
        model,
        unlabelled,
        tmp_path,
        rounds=2,
        strategy=lambda cfg: Calibrated(cfg, cohort, server),
        **plain,
    )
    state = fed.run(fed.start(model))
    assert state.memo["server_steps"] == [0, 1]
    assert accuracy(state.server["global"], labelled) == 1.0  # learnt from the server's labels


# ------------------------------------------------------------------ a trainer of its own
class TinySplitTrainer:
    """Split learning in miniature behind the trainer interface: each client holds the first
    layer (its own copy, kept across rounds), the server the second; every batch the clients
    send activations, the server steps once on all of them together and returns each client's
    activation gradient. The ledger counts what crossed: activations up, gradients down."""

    local_epochs = 1

    def train_round(self, fed, state, chosen, round_, lr):
        server = state.server["global"]
        losses = torch.zeros(len(chosen))
        for step in range(3):
            acts, targets = [], []
            for c in chosen:
                w = state.clients.setdefault(c, {"w": server["client_init"].clone()})["w"]
                idx = torch.as_tensor(fed.data.clients[c][step * 8 : (step + 1) * 8])
                x = to_float(fed.data.images[idx]).flatten(1)
                acts.append((x @ w).detach().requires_grad_(True))
                targets.append(fed.data.labels[idx])
                state.ledger.sent(c, {"act": acts[-1]}, "activations")
            v = server["v"].clone().requires_grad_(True)
            loss = F.cross_entropy(torch.cat(acts) @ v, torch.cat(targets))
            grads = torch.autograd.grad(loss, [v, *acts])
            server["v"] = (v - lr * grads[0]).detach()
            for i, c in enumerate(chosen):
                state.ledger.received(c, {"grad": grads[1 + i]}, "gradients")
                idx = torch.as_tensor(fed.data.clients[c][step * 8 : (step + 1) * 8])
                x = to_float(fed.data.images[idx]).flatten(1)
                state.clients[c]["w"] -= lr * x.T @ grads[1 + i]
                losses[i] += loss.detach() / 3
        weights = torch.tensor([len(fed.data.clients[c]) for c in chosen], dtype=torch.float64)
        return RoundUpdates(
            chosen,
            [state.clients[c] for c in chosen],
            weights,
            [0] * len(chosen),
            losses,
            24 * len(chosen),
        )


class SplitSync(Strategy):
    def init_server(self, model):
        g = torch.Generator().manual_seed(0)
        return {
            "global": {
                "client_init": 0.01 * torch.randn(784, 16, generator=g),
                "v": 0.01 * torch.randn(16, 3, generator=g),
            }
        }

    def aggregate(self, state, updates):  # sync: every client gets the mean client layer
        mean = fedavg(stacked(updates.uploads), updates.weights)
        for c in updates.clients:
            state.clients[c] = {k: v.clone() for k, v in mean.items()}


def test_a_split_learning_trainer_plugs_in_and_resumes_exactly(tmp_path):
    data = labelled_data()
    runs = {}
    for name, kill in (("full", None), ("killed", 1)):
        (tmp_path / name).mkdir()
        cfg = FederationConfig(rounds=3, client_fraction=1.0, lr=0.5, seed=0)

        def fed():
            return Federation(
                SplitSync(cfg), TinySplitTrainer(), data, cfg, tmp_path / name / "ck.pt", "fp"
            )

        def stop(state):
            if state.round == kill:
                raise KeyboardInterrupt

        if kill:
            with pytest.raises(KeyboardInterrupt):
                f = fed()
                f.run(f.start(None), on_round=stop)
        f = fed()
        runs[name] = f.run(f.start(None))
    full, resumed = runs["full"], runs["killed"]
    assert torch.equal(full.server["global"]["v"], resumed.server["global"]["v"])
    assert all(torch.equal(full.clients[c]["w"], resumed.clients[c]["w"]) for c in range(3))
    row = full.ledger.summary()["per_client"][0]
    assert row["up_by_kind"] == {"activations": 3 * 3 * 8 * 16 * 4}
    assert row["down_by_kind"] == {"gradients": 3 * 3 * 8 * 16 * 4}
    assert full.log[-1]["loss"] < full.log[0]["loss"]


def test_one_by_one_clients_train_as_if_each_were_alone():
    """BN clients trained in turn through one reused row (weights, buffers, optimizer state)
    end bit for bit where each trains alone from a fresh state: clients that start from
    different weights (a refill that missed a tensor keeps the last client's), Adam (moments
    carried over from the last client would move the next one's first steps)."""
    data = toy_data()
    starts = [model_state(tiny_model(norm="bn", seed=s)) for s in range(3)]
    trainer = cohort_of(tiny_model(norm="bn"), simclr_loss(0.5), False, opt="adam")
    gen = torch.Generator()  # the identity views draw nothing
    together, losses = trainer.train(starts, data, [0, 1, 2], 0.05, (0,), gen)
    for i in range(3):
        alone, loss = trainer.train([starts[i]], data, [i], 0.05, (0,), gen)
        assert torch.equal(loss[0], losses[i])
        assert all(torch.equal(together[k][i], alone[k][0]) for k in alone)
