"""The personal-model companion on any network (not only MpFedcon's), IFCA's pool on the toy
federation, and MOON's references: the library pieces a method binds."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedssl.fl.cohort import Batch, CohortTrainer, OptimizerConfig
from fedssl.fl.state import FederationConfig
from fedssl.rounds.loop import Federation, LocalTraining
from fedssl.strategies.apfl import apfl_mixture, companion_apfl_loss
from fedssl.strategies.ditto import anchor_of, personal_ce
from fedssl.strategies.ifca import IFCA
from fedssl.strategies.personal import network_ce, part, with_companion
from fedssl.strategies.scaffold import companion_corrected
from tests.strategies.toy import DIM, features, toy_clients

CLASSES = 30  # the toy clients' targets, as labels


class Holder(nn.Module):
    """Any module that holds its classifier as ``classifier`` (not MpFedcon's ``net``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.classifier = nn.Linear(DIM, CLASSES)

    def forward(self, x):
        return self.classifier(x.flatten(1))


def batch_of(n=8) -> Batch:
    data = toy_clients()
    x = features(data.images[:n])[0]
    return Batch((x,), data.labels[:n], torch.ones(n, dtype=torch.bool))


def test_a_companion_copies_any_network_and_its_losses_read_it():
    model = with_companion(Holder(), "personal", of="classifier", alpha=0.25)
    assert [k for k, _ in model.named_parameters()] == [
        "alpha",
        "classifier.weight",
        "classifier.bias",
        "personal.weight",
        "personal.bias",
    ]
    with torch.no_grad():
        model.personal.weight.add_(0.5)  # v differs from w
    b = batch_of()
    params = dict(model.named_parameters())
    x, y = b.views[0], b.labels
    v = part(params, "personal")
    ce_v = F.cross_entropy(torch.func.functional_call(model.classifier, v, (x,)), y)
    assert torch.allclose(personal_ce("classifier")(model, params, {}, b), ce_v)
    mixed = apfl_mixture(params["alpha"], v, part(params, "classifier"))
    ce_mix = F.cross_entropy(torch.func.functional_call(model.classifier, mixed, (x,)), y)
    expected = F.cross_entropy(model(x), y) + ce_mix
    got = companion_apfl_loss("classifier", "personal")(model, params, {}, b)
    assert torch.allclose(got, expected)
    assert anchor_of("personal", "anchor")("personal.weight") == "anchor.weight"
    assert anchor_of("personal", "anchor")("classifier.weight") is None


def test_a_companion_correction_adds_the_inner_product_with_w():
    model = with_companion(Holder(), "correction", of="classifier")
    with torch.no_grad():
        for q in model.correction.parameters():
            q.fill_(0.1)
    params, b = dict(model.named_parameters()), batch_of()
    plain = network_ce("classifier")
    base = lambda m, p, bu, ba: plain(m, part(p, "classifier"), ba.views[0], ba.labels, ba.valid)  # noqa: E731
    w = part(params, "classifier")
    drift = 0.1 * sum(v.sum() for v in w.values())
    got = companion_corrected(base, "classifier", "correction")(model, params, {}, b)
    assert torch.allclose(got, base(model, params, {}, b) + drift)


def test_ifca_puts_each_client_on_the_pool_model_that_fits_its_data(tmp_path):
    """Two pool models, the second biased towards client 2's labels: after exploring, each
    client takes the model with its lowest cross-entropy, and each cluster averages its own."""
    data, net = toy_clients(), Holder()
    pool = [{k: v.detach().clone() for k, v in net.state_dict().items()} for _ in range(2)]
    pool[1]["classifier.bias"][20:25] += 5.0  # client 2's targets are 20..24
    cfg = FederationConfig(rounds=1, client_fraction=1.0, lr=0.1)
    strategy = IFCA(cfg, data, pool, net, SimpleNamespace(explore_rounds=0, patience=2))
    cohort = CohortTrainer(
        net, lambda b, g: features(b), classify, OptimizerConfig("sgd"), 8, 1, parallel=False
    )
    fed = Federation(strategy, LocalTraining(cohort), data, cfg, tmp_path / "c.pt", "ifca")
    state = fed.start(net)
    losses = strategy.train_losses(state, strategy.download(state, 0))
    assert list(np.argmin(losses, 1)) == [0, 0, 1]
    uploads = {}
    upload = strategy.upload
    strategy.upload = lambda s, c, t: uploads.setdefault(c, upload(s, c, t))
    state = fed.run(state)
    assert state.memo["last_choice"] == [0, 0, 1]
    assert state.log[0]["clusters_used"] == 2
    assert state.ledger.up[2]["cluster_id"] == 8  # n_u, one int64
    assert torch.equal(state.server["pool1"]["classifier.bias"], uploads[2]["classifier.bias"])
    mean = (uploads[0]["classifier.bias"] + uploads[1]["classifier.bias"]) / 2  # equal sizes
    assert torch.allclose(state.server["pool0"]["classifier.bias"], mean)


def classify(model, params, buffers, batch):
    logits = torch.func.functional_call(model, (params, buffers), (batch.views[0],))
    return F.cross_entropy(logits, batch.labels)
