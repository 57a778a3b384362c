"""The k-NN monitor (fedssl.eval.monitor) as the engine's logging hook: it logs the global
encoder's k-NN accuracy at its rounds and the untrained network's in round 1's row, and it
moves nothing of the training (losses, weights, the random streams)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedssl.eval.monitor import KnnMonitor, ModuleFeatures, backbone_of, monitor_of
from fedssl.methods import federated
from fedssl.models.encoders import seeded_contrastive_model
from fedssl.params import KnnParams
from tests.fixtures import federation_changed
from tests.fl.test_engine import toy_data
from tests.methods.fedsimclr.test_fedsimclr_rules import SHAPE, tiny_params

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(tmp_path, monitored: bool, rounds: int = 3):
    p = federation_changed(tiny_params(), rounds=rounds)
    model = seeded_contrastive_model(p.model, SHAPE, 0, torch.device("cpu"))
    data = toy_data()
    fed = federated.make_federation(p, model, data, tmp_path / f"ck{monitored}.pt", "fp")
    state = fed.start(model)
    if monitored:
        labels = data.labels.numpy()
        fed.monitor = KnnMonitor(
            ModuleFeatures(model),
            data.images,
            labels,
            data.images[:30],
            labels[:30],
            2,
            rounds,
            KnnParams(k=5),
        )
        fed.monitor.start = fed.monitor.accuracy()
    torch.manual_seed(123)  # the global stream: the monitor must not draw from it either
    state = fed.run(state)
    return state, torch.rand(1).item(), fed.monitor


def test_the_monitor_logs_and_moves_nothing(tmp_path):
    plain, after_plain, _ = _run(tmp_path, monitored=False)
    watched, after_watched, monitor = _run(tmp_path, monitored=True)
    assert [r["loss"] for r in watched.log] == [r["loss"] for r in plain.log]
    for k, v in plain.server["global"].items():
        assert torch.equal(watched.server["global"][k], v), k
    assert after_watched == after_plain
    # every 2nd round and the last (rounds 2 and 3), the untrained network in round 1's row
    assert [("knn_monitor" in r) for r in watched.log] == [False, True, True]
    assert watched.log[0]["knn_monitor_round0"] == monitor.start
    assert not any(k.startswith("knn_monitor") for r in plain.log for k in r)
    # what it logged is the accuracy of the global model of that round
    assert watched.log[-1]["knn_monitor"] == monitor.accuracy(watched.server["global"])
    assert 0.0 <= monitor.start <= 100.0


def test_monitor_accuracy_is_k_nn_of_the_backbone():
    """On features that separate the classes perfectly, the monitor reads 100 %; a model
    without a backbone is refused with a message naming the setting."""

    class Ident(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Flatten()

    labels = np.array([0, 1] * 10)
    images = torch.zeros(20, 1, 2, 2, dtype=torch.uint8)
    images[labels == 1, 0, 0, 0] = 255
    images[labels == 0, 0, 1, 1] = 255
    monitor = KnnMonitor(
        ModuleFeatures(Ident()), images, labels, images, labels, 1, 1, KnnParams(k=3)
    )
    assert monitor.accuracy() == 100.0
    assert (
        monitor.due(0)
        and KnnMonitor(
            ModuleFeatures(Ident()), images, labels, images, labels, 0, 1, KnnParams()
        ).due(0)
        is False
    )
    with pytest.raises(ValueError, match="monitor_every"):
        backbone_of(torch.nn.Linear(2, 2))


def test_the_monitor_reads_the_backbone_before_any_module_named_encoder(tmp_path):
    """FedBYOL's ``encoder`` holds its backbone and projector: the monitor reads the backbone.
    A ViT learner of the LW-FedSSL family has no backbone: it reads its online ``encoder``,
    not the target or global copies."""
    from fedssl.methods.fedbyol.model import ByolNet
    from fedssl.methods.lwfedssl import run
    from tests.methods.lwfedssl.test_lwfedssl import stage_model, tiny_exp, toy_data

    byol = ByolNet(tiny_params().model, SHAPE)
    assert backbone_of(byol) is byol.encoder.backbone
    p = tiny_exp("lw_fedssl").method
    data, server = toy_data()
    _, learner = run.make_federation(p, stage_model(p, 2), 2, data, tmp_path / "c.pt", "fp", server)
    assert learner.global_encoder is not None and backbone_of(learner) is learner.encoder


class Flat(torch.nn.Module):
    """A model whose backbone flattens the images."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Flatten()


class Splits:
    """A stage context's data as the monitor reads it: images whose one pixel is their index in
    their split, two classes in each split, three clients and a server holdout."""

    def split(self, name="train"):
        n = 120 if name == "train" else 60
        return np.arange(n, dtype=np.uint8).reshape(n, 1, 1, 1), np.arange(n) % 2

    def clients(self):
        return [np.arange(0, 30), np.arange(30, 70), np.arange(70, 90)]

    def server_indices(self):
        return np.arange(90, 120)


def test_the_monitor_draws_its_bank_from_the_clients_and_its_queries_from_the_chosen_split():
    """One draw for every method: the bank is a class-stratified subset of the clients' images
    (never the holdout), the queries of the test split or of the server holdout, each seeded
    apart from the training and the same whichever queries are chosen."""

    def drawn(seed=0, queries="test"):
        features, cpu, knn = ModuleFeatures(Flat()), torch.device("cpu"), KnnParams(k=3)
        m = monitor_of(Splits(), features, cpu, 1, 1, seed, knn, (20, 10), queries)
        return [
            (m.bank.flatten().tolist(), m.bank_labels.tolist()),
            (m.queries.flatten().tolist(), m.query_labels.tolist()),
        ]

    test, held = drawn(), drawn(queries="holdout")
    (bank, bank_labels), (queries, query_labels) = test
    assert held[0] == test[0] and len(bank) == 20 and max(bank) < 90
    assert bank_labels == [i % 2 for i in bank] and sum(bank_labels) == 10  # stratified
    assert len(queries) == 10 and query_labels == [i % 2 for i in queries]
    held_queries, held_labels = held[1]
    assert len(held_queries) == 10 and min(held_queries) >= 90 and sum(held_labels) == 5
    assert held_labels == [i % 2 for i in held_queries]
    assert drawn(seed=1)[0] != test[0] and drawn(seed=1)[1] != test[1]
