"""MpFedcon and its baselines on the engine: what travels and what stays (bytes, personal
heads), the head-first schedule, class centres (Eqs. 3-4), the contrastive body loss (Eq. 5,
A4), FedProx, fine-tuning, upload noise, exact resume, params validation; plus the shared
pieces added for them (phases, per-kind traffic, padded crop + flip, last-N accuracy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedssl.data.augment import pad_crop_flip
from fedssl.fl.cohort import LocalData
from fedssl.fl.state import nbytes
from fedssl.methods.gradient_leakage import LeakageParams
from fedssl.methods.mpfedcon import MpFedconParams
from fedssl.methods.mpfedcon import run as R
from fedssl.methods.mpfedcon import train as T
from fedssl.methods.mpfedcon.nets import Anchored, build_net
from tests.fixtures import method_params, toy_images

NET = {
    "base": "cnn",
    "conv_channels": [4, 8],
    "kernel_size": 5,
    "hidden": [16],
    "projection": [16, 8],
}
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def params(variant: str = "mpfedcon", **kw) -> MpFedconParams:
    """Tiny params of ``variant``; ``fedprox``: FedAvg under the library's FedProx (``mu_p``)."""
    if variant == "fedprox":
        mu = kw.pop("mu_p", 0.1)
        variant, kw = "fedavg", {**kw, "strategy": {"kind": "fedprox", "mu": mu}}
    base = dict(
        variant=variant,
        net=NET,
        rounds=3,
        client_fraction=1.0,
        head_epochs=1,
        body_epochs=1,
        batch_size=10,
        lr=0.05,
        momentum=0.5,
        mu=1.0,
    )
    return method_params(MpFedconParams, {**base, **kw})


def toy_federation(tmp_path, p: MpFedconParams, name: str = "ck.pt", sizes=(20, 20, 20)):
    """Three parties of two classes each (4 bar classes), ``sizes`` training (at most 60) and
    10 test images."""
    images, labels = toy_images(120, 0)
    test_images, test_labels = toy_images(80, 1)
    pairs = ([0, 1], [1, 2], [2, 3])
    tr = [np.flatnonzero(np.isin(labels, pair))[:n] for pair, n in zip(pairs, sizes)]
    te = [np.flatnonzero(np.isin(test_labels, pair))[:10] for pair in pairs]
    data = LocalData(torch.from_numpy(images[:, None]), torch.from_numpy(labels), tr)
    tests = T.TestData(torch.from_numpy(test_images[:, None]), torch.from_numpy(test_labels), te)
    model = R.seeded_model(p, (1, 28, 28), 4, CPU)
    return R.make_federation(p, model, data, tests, tmp_path / name, "fp"), model


def run(tmp_path, p, name="ck.pt"):
    fed, model = toy_federation(tmp_path, p, name)
    return fed, fed.run(fed.start(model))


def layer_bytes(model: Anchored, *layers: str) -> int:
    return nbytes(
        {
            k: v
            for k, v in model.state_dict().items()
            if k.split(".")[0] == "net" and k.split(".")[1] in layers
        }
    )


# ------------------------------------------------------------------ what travels
@pytest.mark.parametrize(
    "variant,shared",
    [
        ("fedavg", ("base", "projector", "output")),
        ("fedrep", ("base",)),
        ("lg_fedavg", ("projector", "output")),
        ("solo", ()),
    ],
)
def test_only_the_shared_layers_travel_and_the_rest_stays(tmp_path, variant, shared):
    fed, state = run(tmp_path, params(variant, rounds=2))
    model = fed.strategy.model
    per_round = layer_bytes(model, *shared)
    for row in state.ledger.summary()["per_client"]:
        assert row["bytes_up"] == row["bytes_down"] == 2 * per_round
    init = fed.strategy.init_server(R.seeded_model(fed.strategy.p, (1, 28, 28), 4, CPU))["global"]
    for k in fed.strategy.personal:  # the server never sees the personal layers
        assert torch.equal(state.server["global"][k], init[k]), k
    if fed.strategy.personal:
        k = fed.strategy.personal[0]
        assert not torch.equal(state.clients[0][k], state.clients[1][k])  # each its own
        assert set(state.clients[0]) == set(fed.strategy.personal)
    else:
        assert state.clients == {}


def test_the_server_averages_the_shared_layers_weighted_by_each_partys_data_size(tmp_path):
    """Alg. 1 l.29: theta^{t+1} = sum_i |D_i| theta_i / sum_i |D_i| over the round's parties,
    |D_i| read from the partition (40, 10 and 20 images), not the uploads' plain mean."""
    fed, model = toy_federation(tmp_path, params("mpfedcon", rounds=1), sizes=(40, 10, 20))
    s, seen = fed.strategy, []
    aggregate = s.aggregate

    def spy(state, updates):
        seen.append(
            (updates.clients, [{k: v.clone() for k, v in u.items()} for u in updates.uploads])
        )
        aggregate(state, updates)

    s.aggregate = spy
    state = fed.run(fed.start(model))
    ((clients, uploads),) = seen
    assert clients == [0, 1, 2]
    n = torch.tensor([len(fed.data.clients[c]) for c in clients], dtype=torch.float64)
    assert n.tolist() == [40, 10, 20]
    for k in s.shared:
        thetas = torch.stack([u[k].double() for u in uploads])
        weighted = torch.einsum("i,i...->...", n, thetas) / n.sum()
        got = state.server["global"][k].double()
        assert torch.allclose(got, weighted, rtol=1e-5, atol=1e-7), k
        assert not torch.allclose(got, thetas.mean(0), rtol=1e-3, atol=1e-5), k  # it tells
    for k in s.personal:  # the server's copy of a personal layer is never averaged
        assert torch.equal(state.server["global"][k], model.state_dict()[k]), k


def test_mpfedcon_sends_the_base_and_class_centres_and_counts_their_bytes(tmp_path):
    fed, state = run(tmp_path, params("mpfedcon", rounds=2))
    model, d = fed.strategy.model, 8
    base = layer_bytes(model, "base")
    bank = 4 * d * 4 + 4 * 4  # [C, d] centres + [C] has_centre, fp32
    local = 2 * d * 4 + 2 * 8 + 2 * 8  # 2 classes: centres, class ids, counts (int64)
    for row in state.ledger.summary()["per_client"]:
        assert row["down_by_kind"] == {"model": 2 * base, "centres": 2 * bank}
        assert row["up_by_kind"] == {"model": 2 * base, "centres": 2 * local}
    assert state.server["centres"]["has_centre"].tolist() == [1.0] * 4


# ------------------------------------------------------------------ local schedule
def test_the_head_trains_first_with_the_base_frozen_then_the_base_with_the_head_frozen(tmp_path):
    fed, model = toy_federation(tmp_path, params("fedrep"))
    state = fed.start(model)
    s = fed.strategy
    start = s.local_start(state, 0, s.download(state, 0))
    head, body = fed.trainer.phases
    gen = torch.Generator().manual_seed(0)
    after_head, _ = head.cohort.train([start], fed.data, [0], 0.1, (0,), gen, head.trainable(state))
    after_body, _ = body.cohort.train(
        [{k: v[0] for k, v in after_head.items()}],
        fed.data,
        [0],
        0.1,
        (1,),
        gen,
        body.trainable(state),
    )
    for k in s.shared:
        assert torch.equal(after_head[k][0], start[k]), k  # phase A: base untouched
        assert not torch.equal(after_body[k][0], start[k]), k
    for k in s.personal:
        assert not torch.equal(after_head[k][0], start[k]), k
        assert torch.equal(after_body[k][0], after_head[k][0]), k  # phase B: head untouched
    assert fed.trainer.local_epochs == 2


def test_mpfedcon_with_mu_zero_is_fedrep(tmp_path):
    _, rep = run(tmp_path, params("fedrep"), "a.pt")
    _, con = run(tmp_path, params("mpfedcon", mu=0.0), "b.pt")
    assert rep.memo["personal"]["accuracy"] == con.memo["personal"]["accuracy"]
    for k, v in rep.server["global"].items():
        assert torch.allclose(v, con.server["global"][k], atol=1e-6), k


def test_the_contrastive_term_is_masked_until_a_class_has_a_centre():
    p = params("mpfedcon", mu=5.0)
    model = R.seeded_model(p, (1, 28, 28), 4, CPU)
    images, labels = toy_images(8, 0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for k in list(state):  # a distinct anchor, as after the head phase
        if k.startswith("anchor."):
            state[k] = state[k] + 0.1 * torch.randn_like(state[k])
    from fedssl.fl.cohort import Batch

    batch = Batch(
        (torch.from_numpy(images[:, None]).float() / 255,),
        torch.from_numpy(labels),
        torch.ones(8, dtype=torch.bool),
    )
    params_ = {k: v for k, v in state.items() if k not in ("centres", "has_centre")}
    buffers = {"centres": torch.randn(4, 8), "has_centre": torch.zeros(4)}
    ce = T.ce_loss()(model, params_, buffers, batch)
    con = T.contrast_loss(5.0, 0.5)
    assert torch.allclose(con(model, params_, buffers, batch), ce)  # no centre yet: CE only
    buffers["has_centre"] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    logits, z, z_con = torch.func.functional_call(model, (params_, buffers), (batch.views[0], True))
    rows = batch.labels == 0
    cos = torch.nn.functional.cosine_similarity
    pos, neg = cos(z[rows], buffers["centres"][0][None]), cos(z[rows], z_con[rows])
    l_con = -torch.log(torch.exp(pos / 0.5) / (torch.exp(pos / 0.5) + torch.exp(neg / 0.5)))
    assert torch.allclose(con(model, params_, buffers, batch), ce + 5.0 * l_con.mean(), atol=1e-5)


# ------------------------------------------------------------------ class centres
def test_local_centres_are_class_means_and_the_server_weights_them_by_counts(tmp_path):
    fed, model = toy_federation(tmp_path, params("mpfedcon"))
    s, state = fed.strategy, fed.start(model)
    start = s.local_start(state, 1, s.download(state, 1))
    up = s.local_centres(1, start)
    idx = torch.as_tensor(fed.data.clients[1])
    with torch.no_grad():
        z = model.net.project(fed.data.images[idx].float() / 255)
    y = fed.data.labels[idx]
    assert up["centre_classes"].tolist() == [1, 2]
    for row, c in enumerate([1, 2]):
        assert torch.allclose(up["centres"][row], z[y == c].mean(0), atol=1e-5)
        assert up["centre_counts"][row] == (y == c).sum()
    # two parties hold class 1 with 3 and 1 samples; class 3 keeps its stale centre
    state.server["centres"]["centres"][3] = 7.0
    state.server["centres"]["has_centre"][3] = 1.0
    a = {
        "centres": torch.ones(1, 8),
        "centre_classes": torch.tensor([1]),
        "centre_counts": torch.tensor([3]),
    }
    b = {
        "centres": torch.full((2, 8), 5.0),
        "centre_classes": torch.tensor([1, 2]),
        "centre_counts": torch.tensor([1, 4]),
    }
    s.aggregate_centres(state, [a, b])
    bank = state.server["centres"]
    assert torch.allclose(bank["centres"][1], torch.full((8,), 2.0))  # (3*1 + 1*5) / 4
    assert torch.allclose(bank["centres"][2], torch.full((8,), 5.0))
    assert torch.allclose(bank["centres"][3], torch.full((8,), 7.0))
    assert bank["has_centre"].tolist() == [0.0, 1.0, 1.0, 1.0]


# ------------------------------------------------------------------ baselines
def test_fedprox_adds_the_proximal_term_and_pulls_towards_the_global_model(tmp_path):
    drift = {}
    for mu in (0.0, 5.0):
        p = params("fedprox", mu_p=mu, lr=0.05, body_epochs=8)
        fed, model = toy_federation(tmp_path, p, f"{mu}.pt")
        state = fed.start(model)
        start = fed.strategy.local_start(state, 0, fed.strategy.download(state, 0))
        trained, _ = fed.trainer.phases[0].cohort.train(
            [start],
            fed.data,
            [0],
            0.05,
            (0,),
            torch.Generator().manual_seed(0),
            fed.strategy.net_params,
        )
        drift[mu] = sum(((trained[k][0] - start[k]) ** 2).sum() for k in fed.strategy.shared)
    assert drift[5.0] < 0.5 * drift[0.0]
    # the loss itself: CE + mu/2 ||w - anchor||^2 over the network's parameters
    from fedssl.fl.cohort import Batch

    images, labels = toy_images(4, 0)
    batch = Batch(
        (torch.from_numpy(images[:, None]).float() / 255,),
        torch.from_numpy(labels),
        torch.ones(4, dtype=torch.bool),
    )
    fed, model = toy_federation(tmp_path, params("fedprox", mu_p=3.0), "3.pt")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    buffers = {k: state.pop(k) for k in ("centres", "has_centre")}
    anchors = {"fedprox." + k: v for k, v in state.items() if k.startswith("net.")}
    moved = {k: v + 0.01 if k.startswith("net.") else v for k, v in state.items()}
    sq = sum(v.numel() * 1e-4 for k, v in state.items() if k.startswith("net."))
    ce = T.ce_loss()(model, moved, buffers, batch)
    objective = fed.trainer.phases[0].cohort.loss_fn  # the strategy's, around CE
    prox = objective(model, moved, {**buffers, **anchors}, batch)
    assert torch.allclose(prox, ce + 1.5 * sq, rtol=1e-4)


def test_fedavg_with_fine_tuning_personalises_the_head_only(tmp_path):
    fed, state = run(tmp_path, params("fedavg_ft", rounds=2, finetune_epochs=3))
    heads, features = fed.strategy.finetuned_heads(state, 1)
    w = heads.states["1.weight"]  # O of every party after its fine-tuning
    assert not torch.allclose(w[0], w[2])
    out = fed.strategy.outputs(state, 1)[0]
    _, plain = run(tmp_path, params("fedavg", rounds=2), "plain.pt")
    assert np.mean(out) >= np.mean(plain.memo["personal"]["accuracy"][-1])
    assert len(state.memo["personal"]["accuracy"]) == 2


def test_upload_noise_has_the_requested_variance(tmp_path):
    fed, model = toy_federation(
        tmp_path, params("fedavg", upload_noise={"kind": "laplace", "variance": 1e-2})
    )
    state = fed.start(model)
    trained = fed.strategy.local_start(state, 0, fed.strategy.download(state, 0))
    sent = fed.strategy.upload(state, 0, trained)
    diff = torch.cat([(sent[k] - trained[k]).flatten() for k in fed.strategy.shared])
    # 3420 values: the sample variance's standard error is 1e-2 * sqrt(5 / n) = 4e-4
    assert diff.numel() > 3000 and abs(diff.var().item() - 1e-2) < 1.2e-3
    assert abs(diff.mean().item()) < 6e-3
    # heavier tails than a Gaussian of the same variance (Laplace kurtosis 6)
    assert ((diff / diff.std()) ** 4).mean() > 4.5


# ------------------------------------------------------------------ state and resume
def killed_and_resumed(tmp_path, p):
    """(the state of an uninterrupted run of ``p``, the start of the same run killed at round
    2 and started again, and the federation that resumes it)."""
    _, full = run(tmp_path, p, "full.pt")
    fed, model = toy_federation(tmp_path, p, "killed.pt")

    def kill(state):
        if state.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fed.run(fed.start(model), on_round=kill)
    fed, model = toy_federation(tmp_path, p, "killed.pt")
    return full, fed.start(model), fed


def test_a_killed_run_resumes_exactly_with_every_partys_state(tmp_path):
    p = params("mpfedcon", rounds=3, client_fraction=2 / 3, neg_source="prev_local")
    full, start, fed = killed_and_resumed(tmp_path, p)
    assert start.round == 2 and any(k.startswith("prev.") for k in start.clients[0])
    resumed = fed.run(start)
    for part in ("global", "centres"):
        for k, v in full.server[part].items():
            assert torch.equal(v, resumed.server[part][k]), k
    assert full.clients.keys() == resumed.clients.keys()
    for c in full.clients:
        for k, v in full.clients[c].items():
            assert torch.equal(v, resumed.clients[c][k]), (c, k)
    assert full.memo == resumed.memo and full.ledger == resumed.ledger


def test_personal_accuracy_is_recorded_every_round_for_every_party(tmp_path):
    _, state = run(tmp_path, params("fedrep", rounds=5, lr=0.2, head_epochs=4, body_epochs=4))
    acc = state.memo["personal"]["accuracy"]
    assert len(acc) == 5 and all(len(a) == 3 for a in acc)
    assert [r["personal_acc"] for r in state.log] == [round(float(np.mean(a)), 3) for a in acc]
    assert np.mean(acc[0]) == 50.0 and np.mean(acc[-1]) > 90  # it learns the bars


def test_a_sparse_personal_schedule_measures_its_rounds_and_changes_nothing_else(tmp_path):
    """personal_every: 3 over 6 rounds evaluates rounds 3 (every third) and 4-6 (the last 3):
    the same accuracies the every-round run measured there, no personal column elsewhere in
    the round log, and the same trained parties (the evaluation draws nothing, moves nothing)."""
    kw = dict(rounds=6, lr=0.2, head_epochs=2, body_epochs=2)
    _, dense = run(tmp_path, params("fedrep", **kw), "dense.pt")
    _, sparse = run(tmp_path, params("fedrep", personal_every=3, **kw), "sparse.pt")
    kept = sparse.memo["personal"]
    assert kept["rounds"] == [3, 4, 5, 6] and dense.memo["personal"]["rounds"] == [1, 2, 3, 4, 5, 6]
    assert kept["accuracy"] == dense.memo["personal"]["accuracy"][2:]
    assert ["personal_acc" in r for r in sparse.log] == [False, False, True, True, True, True]
    for c in dense.clients:
        for k, v in dense.clients[c].items():
            assert torch.equal(v, sparse.clients[c][k]), (c, k)


def test_a_sparse_schedule_must_cover_the_rounds_the_summary_averages():
    """Refused before compute, naming both fields: the last 10 rounds averaged, the schedule
    evaluating each of the last 5 only."""
    from fedssl.experiment import experiment_model
    from fedssl.presets import Presets

    exp = Presets().load("experiment", "board2_m100_fedrep_dir01_s0").model_dump()
    exp["method"]["personal_every"] = 5
    refused = r"method.personal_every: 5 .* personal.last_rounds averages the last 10"
    with pytest.raises(ValidationError, match=refused):
        experiment_model().model_validate(exp)
    exp["method"]["personal_every"] = 10
    assert experiment_model().model_validate(exp).method.personal_every == 10


# ------------------------------------------------------------------ params
def test_params_validate_the_split_and_the_attack_settings():
    assert params("fedper").shared_layers == ("base",)
    assert params("lg_fedavg").shared_layers == ("projector", "output")
    assert params("fedrep", shared=["base", "projector"]).shared_layers == ("base", "projector")
    with pytest.raises(ValidationError, match="shares"):
        params("solo", shared=["base"])
    with pytest.raises(ValidationError, match="needs both shared and local"):
        params("fedrep", shared=["base", "projector", "output"])
    with pytest.raises(ValidationError, match="no P"):
        params("fedper", shared=["projector"], net={**NET, "projection": None})
    with pytest.raises(ValidationError):
        params("moon")
    with pytest.raises(ValidationError, match="hidden_fc=3"):
        LeakageParams(settings=[{"label": "cl3", "hidden_fc": 3, "assumed_fc": 1}], fc_hidden=[10])
    with pytest.raises(ValidationError, match="assumed_fc must be null or 0"):
        LeakageParams(settings=[{"label": "full", "hidden_fc": 0, "assumed_fc": 2}])
    with pytest.raises(ValidationError, match="unique"):
        LeakageParams(settings=[{"label": "a"}, {"label": "a"}])


def test_the_network_has_the_specs_sizes():
    """FedRep's CNNCifar: D = 307,192 fp32 values (1.23 MB, the paper's 1.2 MB per transfer);
    with P (64-128-128) and O (128-10) the layered network has 333,314."""
    p = params(net={"base": "cnn"})
    net = build_net(p, (3, 32, 32), 10)
    assert sum(v.numel() for v in net.base.parameters()) == 307_192
    assert sum(v.numel() for v in net.parameters()) == 333_314
    femnist = build_net(params(net={"base": "mlp", "hidden": [512, 256]}), (1, 28, 28), 10)
    assert sum(v.numel() for v in femnist.base.parameters()) == 784 * 512 + 512 + 512 * 256 + 256


# ------------------------------------------------------------------ shared pieces
def test_pad_crop_flip_shifts_and_mirrors_each_sample_on_its_own():
    x = torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).view(2, 3, 5, 5) + 1
    assert torch.equal(pad_crop_flip(x, 0, torch.Generator().manual_seed(0), flip=False), x)
    seen = set()
    for seed in range(40):
        y = pad_crop_flip(x, 2, torch.Generator().manual_seed(seed))
        assert y.shape == x.shape
        for i in range(2):
            # every output is a window of the zero-padded image, maybe mirrored
            padded = torch.nn.functional.pad(x[i], (2, 2, 2, 2))
            windows = []
            for oy in range(5):
                for ox in range(5):
                    w = padded[:, oy : oy + 5, ox : ox + 5]
                    windows += [
                        (oy, ox, f) for f, v in ((0, w), (1, w.flip(-1))) if torch.equal(y[i], v)
                    ]
            assert windows
            seen.add(windows[0])
    assert len(seen) > 20 and {f for *_, f in seen} == {0, 1}


def test_personal_summary_has_the_last_rounds_mean_at_each_checkpoint(tmp_path):
    from fedssl.eval.personal import PersonalLog, summarize
    from fedssl.params import PersonalEvalParams

    memo: dict = {}
    log = PersonalLog(memo)
    for r in range(20):
        log.record([r, r + 2.0])
    log.save(
        tmp_path / "p.npz",
        [np.array([0, 1]), np.array([2])],
        [np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1]]), np.array([[0.1, 0.1, 0.8]])],
    )
    out = summarize(
        tmp_path / "p.npz", PersonalEvalParams(last_rounds=4, checkpoints=(0.5, 1.0), target=10.5)
    )
    assert out["personal_last4"] == pytest.approx(np.mean([17, 18, 19, 20]))
    assert out["personal_last4_at_10"] == pytest.approx(np.mean([7, 8, 9, 10]))
    assert out["personal_at_10"] == 10.0 and out["rounds_to_target"] == 11
    assert out["pooled_top1"] == 1.0


def test_a_sparse_record_is_summarised_over_the_rounds_it_measured(tmp_path):
    """Rounds 5, 10, 15 and 17-20 measured (mean accuracy = the round's number): the last 4
    rounds average 17-20, a checkpoint reads the last measured round up to it (round 10 at
    0.5, round 15 at 0.8), the target's round is the round measured, not the record's index;
    a record that lacks one of the last rounds averaged is refused, naming the field."""
    from fedssl.eval.personal import PersonalLog, summarize
    from fedssl.params import PersonalEvalParams

    def record(numbers, path):
        log = PersonalLog({})
        for r in numbers:
            log.record([r - 1.0, r + 1.0], number=r)
        log.save(path, [np.array([0])], [np.array([[0.9, 0.1]])])
        return path

    path = record([5, 10, 15, 17, 18, 19, 20], tmp_path / "p.npz")
    p = PersonalEvalParams(last_rounds=4, checkpoints=(0.5, 0.8, 1.0), target=12)
    out = summarize(path, p)
    assert out["personal_last4"] == pytest.approx(18.5) and out["rounds"] == 20
    assert (out["personal_at_10"], out["personal_at_16"]) == (10.0, 15.0)
    assert out["personal_last4_at_16"] == 15.0 and out["rounds_to_target"] == 15
    with pytest.raises(ValueError, match="personal.last_rounds: 4, but the record holds 3"):
        summarize(record([5, 10, 15, 18, 19, 20], tmp_path / "q.npz"), p)


def test_the_leakage_table_lays_out_only_the_attack_rows():
    from fedssl.methods.gradient_leakage.tables import leakage_tables

    attack = {
        "experiment": "leak",
        "title": "DLG / iDLG",
        "idlg_label_hit_full": 1.0,
        "idlg_label_hit_cl1_at1": 0.09,
        "about_full": "all gradients",
        "chance_label_hit": 0.1,
        "images_label": 100,
    }
    fedavg = {"experiment": "fedavg_s5", "title": "FedAvg", "personal_top1": 51.8}
    tables = leakage_tables([fedavg, attack])
    assert list(tables) == ["leakage_leak"]
    body = tables["leakage_leak"]
    assert "| full | all gradients | 100% |" in body and "| cl1_at1 |  | 9% |" in body
