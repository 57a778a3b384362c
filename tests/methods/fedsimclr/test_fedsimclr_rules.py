"""FedSimCLR's defining rules (the MFCL paper's baseline): every client minimises NT-Xent
between the projections of two independent augmentations of its batch, and the server takes
the size-weighted FedAvg of the whole model, which travels both ways every round."""

from __future__ import annotations

import pytest
import torch

from fedssl.data.augment import BatchAugment, multi_view
from fedssl.experiment import experiment_model
from fedssl.fl.cohort import Batch
from fedssl.fl.state import nbytes
from fedssl.losses import nt_xent
from fedssl.methods import federated
from fedssl.models.encoders import seeded_contrastive_model
from fedssl.strategies.aggregation import fedavg, stacked
from tests.fixtures import cloned, tiny_experiment
from tests.fl.test_engine import toy_data

pytestmark = pytest.mark.usefixtures("one_thread")
SHAPE = (1, 28, 28)


def tiny_params():
    import yaml

    raw = yaml.safe_load(tiny_experiment("FedSimCLR", "small_cnn", "fedsimclr", rounds=1))
    return experiment_model().model_validate(raw).method


def test_the_local_loss_is_nt_xent_between_two_independent_views():
    p = tiny_params()
    model = seeded_contrastive_model(p.model, SHAPE, 0, torch.device("cpu"))
    images = toy_data().images[:8]
    v1, v2 = multi_view(BatchAugment(p.augment, 28), views=2)(
        images, torch.Generator().manual_seed(0)
    )
    assert not torch.equal(v1, v2)
    weights = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    batch = Batch((v1, v2), torch.zeros(8), torch.ones(8, dtype=torch.bool))
    got = federated.trainer_loss(p)(model, weights, buffers, batch)
    with torch.no_grad():
        expected = nt_xent(model(v1), model(v2), p.temperature)
    assert torch.allclose(got, expected, atol=1e-5)


def test_a_round_is_the_size_weighted_fedavg_of_the_whole_model(tmp_path):
    p = tiny_params()
    model = seeded_contrastive_model(p.model, SHAPE, 0, torch.device("cpu"))
    data = toy_data()
    fed = federated.make_federation(p, model, data, tmp_path / "ck.pt", "fp")
    uploads = []
    upload = fed.strategy.upload
    fed.strategy.upload = lambda state, c, trained: (
        uploads.append(cloned(upload(state, c, trained))) or uploads[-1]
    )
    state = fed.run(fed.start(model))
    sizes = torch.tensor([len(c) for c in data.clients], dtype=torch.float64)
    assert set(uploads[0]) == set(state.server["global"])  # every weight travels
    expected = fedavg(stacked(uploads), sizes)
    for k, v in expected.items():
        assert torch.equal(state.server["global"][k], v), k  # one ordered sum: the same bits
    plain = fedavg(stacked(uploads), torch.ones(3, dtype=torch.float64))
    assert any(
        not torch.allclose(plain[k].float(), v.float(), atol=1e-6)
        for k, v in expected.items()
        if v.is_floating_point()
    )
    s = nbytes(state.server["global"])
    assert all(r["bytes_up"] == r["bytes_down"] == s for r in state.ledger.summary()["per_client"])
