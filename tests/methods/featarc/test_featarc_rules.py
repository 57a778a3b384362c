"""FeatARC's defining rules (spec `baselines.md` §5): each client joins the cluster whose
model's features align best with its own model's on its data; it trains SimCLR plus the
alignment term toward that cluster's features; each cluster model is the uniform mean of its
members (an empty cluster keeps its weights); all C models travel down, one model up; and
C = 1, s = 0 is FedSimCLR with uniform FedAvg, bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedssl.fl.state import nbytes
from fedssl.losses import nt_xent
from fedssl.methods import federated
from fedssl.methods.featarc import FeatARCParams
from fedssl.methods.featarc import model as featarc_model
from fedssl.methods.featarc import strategy as featarc
from fedssl.methods.fedsimclr import FedSimCLRParams
from fedssl.models.encoders import seeded_contrastive_model
from fedssl.strategies.aggregation import fedavg, stacked
from tests.fixtures import cloned, method_params
from tests.fl.test_engine import toy_data

pytestmark = pytest.mark.usefixtures("one_thread")
SHAPE = (1, 28, 28)
MODEL = {"arch": "small_cnn", "norm": "bn", "channels_per_group": 4, "width": 4,
         "proj_hidden": 16, "proj_dim": 8}  # fmt: skip


def tiny_params(**changes) -> FeatARCParams:
    raw = {"model": MODEL, "rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 0.01,
           "clusters": 3, "align_space": "backbone_to_backbone"}  # fmt: skip
    return method_params(FeatARCParams, {**raw, **changes})


def federation(p, tmp_path, data=None):
    """FeatARC's federation on the shared runtime (toy data by default), and its start."""
    model = federated.build_model(p, SHAPE, torch.device("cpu"))
    fed = federated.make_federation(p, model, data or toy_data(), tmp_path / "ck.pt", "fp")
    return fed, fed.start(model)


def test_a_client_joins_the_cluster_whose_features_align_best_with_its_own(tmp_path):
    p = tiny_params()
    fed, state = federation(p, tmp_path)
    s = fed.strategy
    # round 0: the last model of client k is cluster k mod C, so it picks that cluster
    assert [s.assign(state, k) for k in range(3)] == [0, 1, 2]
    # a client whose last model is cluster 2's picks 2; the score is the mean cosine on its data
    state.clients[0] = {featarc.LAST + k: state.server["cluster2"][k] for k in s.backbone_keys}
    scores = s.scores(state, 0)
    assert int(scores.argmax()) == 2 == s.assign(state, 0)
    data = fed.data
    images = data.images[torch.as_tensor(data.clients[0])].float() / 255
    nets = []
    for c in range(3):
        net = seeded_contrastive_model(p.model, SHAPE, 0, torch.device("cpu"))
        net.load_state_dict({k[4:]: v for k, v in state.server[f"cluster{c}"].items()})
        nets.append(F.normalize(net.eval().backbone(images), dim=1).detach())
    expected = torch.stack([(h * nets[2]).sum(1).mean() for h in nets])
    assert torch.allclose(scores, expected, atol=1e-5)
    assert scores[2] == pytest.approx(1.0, abs=1e-5) and scores[:2].max() < 0.999


def test_the_alignment_term_pulls_both_views_toward_the_cluster_feature():
    h = F.normalize(torch.randn(6, 8), dim=1)
    assert featarc_model.alignment_loss(h, h, h).item() == pytest.approx(-1.0)
    assert featarc_model.alignment_loss(h, -h, -h).item() == pytest.approx(1.0)
    y1, y2 = torch.randn(6, 8), torch.randn(6, 8)
    expected = -0.5 * (
        (h * F.normalize(y1, dim=1)).sum(1).mean() + (h * F.normalize(y2, dim=1)).sum(1).mean()
    )
    assert torch.allclose(featarc_model.alignment_loss(h, y1, y2), expected)


def test_the_local_loss_is_nt_xent_plus_s_times_the_alignment_to_the_frozen_anchor(tmp_path):
    p = tiny_params(align_scale=0.7)
    fed, state = federation(p, tmp_path)
    model = fed.strategy.model
    images = toy_data().images[:8]
    v1, v2 = torch.rand(8, *SHAPE), torch.rand(8, *SHAPE)
    raw = images.float() / 255
    from fedssl.fl.cohort import Batch

    batch = Batch((v1, v2, raw), torch.zeros(8), torch.ones(8, dtype=torch.bool))
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    got = federated.trainer_loss(p)(model, params, buffers, batch)
    model.load_state_dict(reference)
    with torch.no_grad():
        z, f = model(torch.cat([v1, v2]))
        h = F.normalize(model.anchor(raw), dim=1)
        expected = nt_xent(*z.chunk(2), p.temperature) + 0.7 * featarc_model.alignment_loss(
            h, *f.chunk(2)
        )
    assert torch.allclose(got, expected, atol=1e-5)


def test_each_cluster_is_the_uniform_mean_of_its_members_and_an_empty_one_stays(tmp_path):
    p = tiny_params(rounds=1)
    fed, state = federation(p, tmp_path)
    uploads = []
    upload = fed.strategy.upload
    fed.strategy.upload = lambda st, c, t: uploads.append(cloned(upload(st, c, t))) or uploads[-1]
    fed.strategy.assign = lambda st, k: 0 if k < 2 else 2  # clusters 0 and 2; 1 is empty
    before = {c: dict(state.server[f"cluster{c}"]) for c in range(3)}
    fed.run(state)
    uniform = fedavg(stacked(uploads[:2]), torch.ones(2, dtype=torch.float64))
    for k, v in uniform.items():
        assert torch.equal(state.server["cluster0"][k], v), k
    assert all(torch.equal(state.server["cluster1"][k], v) for k, v in before[1].items())
    assert all(torch.equal(state.server["cluster2"][k], uploads[2][k]) for k in uploads[2])
    sized = fedavg(stacked(uploads[:2]), torch.tensor([20.0, 30.0], dtype=torch.float64))
    assert any(not torch.equal(sized[k], v) for k, v in uniform.items() if v.is_floating_point())
    # bytes: all C models down, one model up, per client and round
    model_bytes = nbytes(before[0])
    for row in state.ledger.summary()["per_client"]:
        assert row["bytes_down"] == 3 * model_bytes and row["bytes_up"] == model_bytes


def test_one_cluster_without_alignment_is_fedsimclr_with_uniform_fedavg(tmp_path):
    p = tiny_params(clusters=1, align_scale=0.0, rounds=2, weight_decay=1e-6)
    fed, state = federation(p, tmp_path / "f")
    (tmp_path / "f").mkdir()
    state = fed.run(state)
    q = method_params(
        FedSimCLRParams,
        {
            "model": MODEL,
            "rounds": 2,
            "local_epochs": 1,
            "batch_size": 16,
            "lr": 0.01,
            "optimizer": "adam",
            "weight_decay": 1e-6,
            "temperature": p.temperature,
            "augment": p.augment.model_dump(),
        },  # fmt: skip
    )
    net = seeded_contrastive_model(q.model, SHAPE, q.seed, torch.device("cpu"))
    (tmp_path / "s").mkdir()
    ref = federated.make_federation(q, net, toy_data(), tmp_path / "s" / "ck.pt", "fp")

    def uniform(st, updates):
        st.server["global"] = fedavg(
            stacked(updates.uploads), torch.ones(len(updates.uploads), dtype=torch.float64)
        )

    ref.strategy.aggregate = uniform
    expected = ref.run(ref.start(net)).server["global"]
    got = state.server["cluster0"]
    for k, v in expected.items():
        assert torch.equal(got[featarc.NET + k], v), k
    assert [r["loss"] for r in state.log] == [r["loss"] for r in ref.run(ref.start(net)).log]


def test_proj_to_backbone_needs_matching_widths(tmp_path):
    with pytest.raises(ValueError, match="align_space"):
        federation(tiny_params(align_space="proj_to_backbone"), tmp_path)


def test_costs_count_the_local_steps_and_the_scoring_of_every_round():
    from fedssl.methods.featarc import costs as fc

    p = tiny_params()
    rows = fc._client_costs(p, SHAPE, [20, 20], [2, 1], [100, 50])
    assert rows[0]["flops"] == pytest.approx(2 * rows[1]["flops"])
    more = fc._client_costs(tiny_params(local_epochs=2), SHAPE, [20], [1], [50])[0]
    assert more["flops"] > rows[1]["flops"] > 0 and rows[0]["peak_step_bytes"] > 0


def test_the_paper_preset_moves_the_spec_payload_each_round(tmp_path):
    """Spec §5.5 (ResNet-18): down = C = 2 models (+ BN buffers), up one. A model is the
    backbone's 11,168,832 floats and the project's SimCLR head 512-512-512 (525,312; the
    authors' head has a BN after its hidden layer, 1,024 floats more: spec 11,695,168)."""
    from fedssl.presets import Presets
    from tests.fixtures import REPO

    p = Presets(REPO / "params").load("experiment", "cifar10_featarc_dir001").method
    model = federated.build_model(p, (3, 32, 32), torch.device("cpu"))
    net = model.net
    assert sum(q.numel() for q in net.parameters()) == 11_168_832 + 525_312
    data = toy_data()
    data.images = torch.zeros(90, 3, 32, 32, dtype=torch.uint8)
    fed = federated.make_federation(p, model, data, tmp_path / "ck.pt", "fp")
    state = fed.start(model)
    down = nbytes(fed.strategy.download(state, 0))
    up = nbytes(state.server["cluster0"])
    bn = sum(b.numel() * b.element_size() for b in net.buffers())
    assert (down, up) == (2 * (4 * 11_694_144 + bn), 4 * 11_694_144 + bn)


def test_the_projection_counts_c_models_down_and_one_up_per_round():
    from fedssl.methods import registry
    from fedssl.presets import Presets
    from tests.fixtures import REPO

    presets = Presets(REPO / "params")
    exp = presets.load("experiment", "fmnist_featarc")
    got = registry.get("featarc").projected_costs(
        exp, presets.load("partition", exp.partition), "fashion_mnist"
    )
    net = seeded_contrastive_model(exp.method.model, SHAPE, 0, torch.device("cpu"))
    assert got["mean_bytes_exchanged"] == 3 * nbytes(net.state_dict()) * 8  # (C + 1) x 8 rounds
    assert got["mean_flops"] > 0
