"""FSL's defining rules (spec baselines.md §7): the client trains its part and auxiliary head on
its local loss only (no server tensor enters its update), its server copy trains on the smashed
data it receives, every part is FedAvg-ed by data size, and per step the client sends its
smashed batch and labels, and nothing comes back."""

from __future__ import annotations

import pytest
import torch

from fedssl.fl.cohort import client_batches
from fedssl.fl.state import nbytes
from fedssl.methods import federated_supervised as runtime
from fedssl.methods.fsl import FSLParams
from fedssl.methods.fsl import train as fsl
from fedssl.params import ModelParams
from fedssl.strategies.aggregation import fedavg, stacked
from tests.fixtures import cloned
from tests.fl.test_engine import SHAPE, toy_data
from tests.methods.supervised.test_supervised_rules import held_out

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSES, WIDTH = 3, 4


def params(local_epochs: int = 1, rounds: int = 1) -> FSLParams:
    model = ModelParams(arch="small_cnn", norm="bn", channels_per_group=2, width=WIDTH)
    settings = {"rounds": rounds, "lr": 0.05, "local_epochs": local_epochs, "batch_size": 16}
    return FSLParams(model=model, cut=2, federation=settings)


def federation(p, path, model=None):
    model = model or runtime.build_model(p, SHAPE, CLASSES, torch.device("cpu"))
    return runtime.make_federation(p, model, toy_data(), held_out(), path, "fp"), model


def one_round(p, path, model=None):
    fed, model = federation(p, path, model)
    uploads = {}
    upload = fed.strategy.upload
    fed.strategy.upload = lambda s, c, t: uploads.setdefault(c, cloned(upload(s, c, t)))
    return fed.run(fed.start(model)), uploads


def test_the_bytes_per_step_are_the_smashed_batch_and_its_labels_up_and_nothing_down(tmp_path):
    p = params(local_epochs=2)
    state, uploads = one_round(p, tmp_path / "f.pt")
    # small CNN, cut after 2 blocks: 2w channels at half resolution, fp32; int64 labels
    per_sample = 2 * WIDTH * (SHAPE[1] // 2) * (SHAPE[2] // 2) * 4 + 8
    data = toy_data()
    for c, rows in enumerate(state.ledger.summary()["per_client"]):
        steps = client_batches(
            data.clients[c], p.federation.batch_size, p.federation.local_epochs, 0
        )
        assert sum(len(b) for b in steps) == 2 * len(data.clients[c])
        up, down = rows["up_by_kind"], rows["down_by_kind"]
        assert up[fsl.SMASHED] + up[fsl.LABELS] == sum(len(b) * per_sample for b in steps)
        client = {k: v for k, v in uploads[c].items() if k.startswith("client.")}
        aux = {k: v for k, v in uploads[c].items() if k.startswith("aux.")}
        assert up["client_model"] == down["client_model"] == nbytes(client)
        assert up["aux_model"] == down["aux_model"] == nbytes(aux)
        assert set(down) == {"client_model", "aux_model"}  # no gradients, no server part


def test_the_client_update_ignores_the_server_part(tmp_path):
    p = params()
    a = runtime.build_model(p, SHAPE, CLASSES, torch.device("cpu"))
    b = runtime.build_model(p, SHAPE, CLASSES, torch.device("cpu"))
    with torch.no_grad():
        for w in b.server.parameters():
            w.add_(0.5)
    _, up_a = one_round(p, tmp_path / "a.pt", a)
    _, up_b = one_round(p, tmp_path / "b.pt", b)
    for c in up_a:
        server = [k for k in up_a[c] if k.startswith("server.")]
        assert not torch.equal(up_a[c]["server.4.weight"], up_b[c]["server.4.weight"])
        for k in set(up_a[c]) - set(server):  # the client part and auxiliary head
            assert torch.equal(up_a[c][k], up_b[c][k]), k


def test_the_server_copy_learns_from_the_smashed_data_and_every_part_is_averaged(tmp_path):
    p = params()
    model = runtime.build_model(p, SHAPE, CLASSES, torch.device("cpu"))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    state, uploads = one_round(p, tmp_path / "f.pt", model)
    assert not torch.equal(uploads[0]["server.4.weight"], start["server.4.weight"])
    expected = fedavg(
        stacked([uploads[c] for c in range(3)]),
        torch.tensor([20.0, 30.0, 40.0], dtype=torch.float64),
    )
    for k, v in expected.items():
        assert torch.equal(state.server["global"][k], v), k
    assert "global_top1" in state.log[0]


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    p = params(rounds=2)
    fed, model = federation(p, tmp_path / "whole.pt")
    whole = fed.run(fed.start(model))
    fed, model = federation(params(rounds=1), tmp_path / "part.pt")
    fed.run(fed.start(model))  # killed after round 1: its checkpoint remains
    fed, model = federation(p, tmp_path / "part.pt")
    state = fed.start(model)
    assert state.round == 1
    resumed = fed.run(state)
    assert [r["loss"] for r in resumed.log] == [r["loss"] for r in whole.log]
    assert resumed.ledger.summary() == whole.ledger.summary()
    for k, v in whole.server["global"].items():
        assert torch.equal(resumed.server["global"][k], v), k
