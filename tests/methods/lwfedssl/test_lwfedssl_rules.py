"""The LW-FedSSL family's defining rules (spec methods/lw-fedssl.md), each in a test that fails
when the rule changes by one line: a layer-wise client never trains a frozen block; the
learning rate of a round is its place in the whole schedule (cosine over all stages, cyclic per
stage, or fixed), and calibration runs at the position of the round it precedes; alignment is
LW-FedSSL's clients' alone and calibration trains end to end."""

from __future__ import annotations

import math

import pytest
import torch

from fedssl.methods.lwfedssl import run
from tests.fixtures import cloned, federation_changed, spy_local_rounds
from tests.methods.lwfedssl.test_lwfedssl import stage_model, tiny_exp, toy_data

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "method, frozen", [("fedmoco_lw", True), ("lw_fedssl", True), ("prog_fedssl", False)]
)
def test_a_layer_wise_client_never_trains_a_frozen_block(tmp_path, method, frozen):
    """Stage 3: FedMoCo-LW's and LW-FedSSL's clients leave blocks 1-2 and the embedding exactly
    as they received them (LW-FedSSL's server changes them, its clients do not); Prog-FedSSL's
    clients train them. Every client trains the newest block."""
    p = tiny_exp(method).method
    data, server = toy_data()
    fed, learner = run.make_federation(
        p, stage_model(p, 3), 3, data, tmp_path / "ck.pt", "fp", server
    )
    seen = spy_local_rounds(fed)
    fed.run(fed.start(learner))
    older = ("encoder.blocks.0.", "encoder.blocks.1.", "encoder.patch_embed.", "encoder.cls_token")
    for c in range(3):
        start, trained = seen["start", c], seen["trained", c]
        for k, v in start.items():
            if k.startswith(older) and k in dict(learner.named_parameters()):
                assert torch.equal(trained[k], v) == frozen, (c, k)
        assert not torch.equal(
            trained["encoder.blocks.2.mlp.0.weight"], start["encoder.blocks.2.mlp.0.weight"]
        )


def cosine(lr: float, t: int, horizon: int) -> float:
    return lr * 0.5 * (1 + math.cos(math.pi * t / horizon))


@pytest.mark.parametrize("schedule", ["cosine", "cyclic", "fixed"])
def test_the_learning_rate_of_a_round_is_its_place_in_the_schedule(tmp_path, schedule):
    """Stages of 2, 3 and 1 rounds (R = 6), lr 1e-3: cosine decays over all six rounds (stage
    2's rounds are rounds 2-4 of 6), cyclic restarts the cosine in every stage, fixed stays."""
    text = "  stages: {s1: {rounds: 2}, s2: {rounds: 3}, s3: {rounds: 1}}\n"
    p = tiny_exp("fedmoco_lw", text).method
    p = federation_changed(p, lr_schedule=schedule)
    data, _ = toy_data()
    fed, _ = run.make_federation(p, stage_model(p, 2), 2, data, tmp_path / "ck.pt", "fp")
    got = [fed.strategy.lr(r) for r in range(3)]
    expected = {
        "cosine": [cosine(1e-3, 2 + r, 6) for r in range(3)],
        "cyclic": [cosine(1e-3, r, 3) for r in range(3)],
        "fixed": [1e-3] * 3,
    }[schedule]
    assert got == pytest.approx(expected, rel=1e-12)
    if schedule == "cosine":  # FedMoCo: one step of S x R_s = 3 rounds, one cosine over them
        q = tiny_exp("fedmoco").method
        fed, _ = run.make_federation(
            q, run.initial_online(q, (1, 28, 28), 3), None, data, tmp_path / "moco.pt", "fp"
        )
        assert [fed.strategy.lr(r) for r in (0, 1, 2)] == pytest.approx(
            [cosine(1e-3, r, 3) for r in (0, 1, 2)], rel=1e-12
        )


def test_calibration_runs_at_the_learning_rate_of_the_round_it_precedes(tmp_path):
    """Spec 8.5: the server's calibration before round r takes round r's client lr, also in
    the stage's first round (init_server); the log's lr is the clients'."""
    p = tiny_exp("lw_fedssl", "  stages: {s1: {rounds: 2}, s2: {rounds: 3}}\n").method
    data, server = toy_data()
    fed, learner = run.make_federation(
        p, stage_model(p, 2), 2, data, tmp_path / "ck.pt", "fp", server
    )
    calls = []
    calibrate = fed.strategy.calibrate

    def spy(online, round_, lr):
        calls.append((round_, lr))
        return calibrate(online, round_, lr)

    fed.strategy.calibrate = spy
    state = fed.run(fed.start(learner))
    lrs = [r["lr"] for r in state.log]
    assert lrs == pytest.approx([cosine(1e-3, 2 + r, 6) for r in range(3)], rel=1e-12)
    assert calls == [(0, lrs[0]), (1, lrs[1]), (2, lrs[2])]


@pytest.mark.parametrize(
    "method, alpha, prefix",
    [("lw_fedssl", 0.01, 2), ("fedmoco_lw", 0.0, 2), ("prog_fedssl", 0.0, 0)],
)
def test_alignment_is_lw_fedssls_and_calibration_trains_end_to_end(method, alpha, prefix):
    """Stage 3's learners: only LW-FedSSL's clients add alpha l_align against the received
    encoder; a layer-wise client freezes the two older blocks. The server's calibration
    learner has neither: no alignment, nothing frozen."""
    p = tiny_exp(method).method
    model = stage_model(p, 3)
    plan = p.plan(3)
    client = run.learner_of(p, model, 3, plan)
    assert (client.alpha, client.frozen_prefix) == (alpha, prefix)
    assert (client.global_encoder is not None) == (alpha > 0)
    server = run.learner_of(p, model, 3, plan, server=True)
    assert (server.alpha, server.frozen_prefix, server.global_encoder) == (0.0, 0, None)


def test_scratch_is_fedmocos_untrained_starting_encoder(tmp_path):
    """The reference row: the seeded full-depth initial encoder FedMoCo starts from, untrained."""
    from types import SimpleNamespace

    import yaml

    from fedssl.experiment import experiment_model
    from tests.lwfedssl_fixtures import TINY_SCRATCH

    scratch = experiment_model().model_validate(yaml.safe_load(TINY_SCRATCH)).method
    ctx = SimpleNamespace(
        exp=SimpleNamespace(method=scratch), image_shape=(1, 28, 28), out=tmp_path, info={}
    )
    run.scratch(ctx)
    saved = run.load_online(scratch, (1, 28, 28), tmp_path / "model.pt", torch.device("cpu"))
    fedmoco = run.initial_online(tiny_exp("fedmoco").method, (1, 28, 28), 3)
    assert saved["encoder"].depth == 3
    for k, v in fedmoco.state_dict().items():
        assert torch.equal(saved.state_dict()[k], v), k


def test_the_server_averages_what_came_back_weighted_by_client_data_size(tmp_path):
    """Alg. 1: L_s, H, P <- sum_i |D_i| / sum_j |D_j| (.)^i over the clients of the round
    (toy clients hold 40, 30 and 30 images), summed as the clients finish (no upload kept) to
    the very bits of the stacked mean."""
    from fedssl.strategies.aggregation import fedavg, stacked

    p = tiny_exp("fedmoco_lw").method
    data, _ = toy_data()
    fed, learner = run.make_federation(p, stage_model(p, 2), 2, data, tmp_path / "ck.pt", "fp")
    sent = []
    upload = fed.strategy.upload
    fed.strategy.upload = lambda state, c, trained: (
        sent.append(cloned(upload(state, c, trained))) or sent[-1]
    )
    assert not fed.strategy.needs_uploads()
    state = fed.run(fed.start(learner))
    sizes = torch.tensor([40.0, 30.0, 30.0], dtype=torch.float64)
    expected = fedavg(stacked(sent), sizes)
    uniform = fedavg(stacked(sent), torch.ones(3, dtype=torch.float64))
    for k, v in expected.items():
        assert torch.equal(state.server["global"][k], v), k
    assert not torch.allclose(
        expected["encoder.blocks.1.mlp.0.weight"],
        uniform["encoder.blocks.1.mlp.0.weight"],
        atol=1e-7,
    )
