"""The federated BYOL family's defining rules (spec methods/baselines.md §2-3): BYOL with a
per-step EMA target kept on each client; the online network and predictor travel and are
averaged; FedEMA blends a returning client's network with the global one by μ = min(λ_k·d_k, 1)
with the autoscaler's λ_k = τ / d_first (so the first blend has μ = τ, and τ = 0 is FedBYOL);
FedU replaces the online network and keeps its own predictor while its divergence is at or above
the threshold (DAPU)."""

from __future__ import annotations

import math

import pytest
import torch

from fedssl.fl.cohort import Batch
from fedssl.fl.state import nbytes
from fedssl.losses import byol_loss
from fedssl.methods import federated
from fedssl.methods.fedbyol import FedBYOLParams, FedEMAParams, FedUParams
from fedssl.methods.fedbyol.costs import payload_bytes
from fedssl.methods.fedbyol.model import seeded_byol
from fedssl.params import ModelParams
from fedssl.strategies.byol import TARGET, conv_weights, divergence, online_names
from tests.fixtures import method_params
from tests.fl.test_engine import SHAPE, toy_data

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
AUGMENT = {"crop_scale": [0.5, 1.0], "jitter_p": 0.0, "grayscale_p": 0.0}


def params(cls=FedBYOLParams, **kw):
    base = {
        "model": {"arch": "small_cnn", "norm": "gn", "channels_per_group": 4, "width": 4,
                  "proj_hidden": 16, "proj_dim": 8},
        "rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 0.05, "augment": AUGMENT,
    }  # fmt: skip
    return method_params(cls, {**base, **kw})


def federation(p, tmp_path, name="ck.pt"):
    model = seeded_byol(p.model, SHAPE, p.seed, CPU)
    return federated.make_federation(p, model, toy_data(), tmp_path / name, "fp"), model


def run(p, tmp_path, name="ck.pt", spy=None):
    """Run p.rounds rounds; ``spy(client, start)`` sees every client's starting state."""
    fed, model = federation(p, tmp_path, name)
    if spy is not None:
        start = fed.strategy.local_start

        def local_start(state, client, received):
            out = start(state, client, received)
            spy(state.round, client, received, state.clients.get(client), out)
            return out

        fed.strategy.local_start = local_start
    return fed.run(fed.start(model))


def assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_byol_loss_regresses_each_views_prediction_on_the_others_target():
    p = params()
    model = seeded_byol(p.model, SHAPE, 0, CPU)
    x1, x2 = torch.rand(2, 6, *SHAPE, generator=torch.Generator().manual_seed(0))
    batch = Batch((x1, x2), torch.zeros(6), torch.ones(6, dtype=torch.bool))
    weights, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    got = federated.trainer_loss(p)(model, weights, buffers, batch)
    with torch.no_grad():
        p_, z_ = model(torch.cat([x1, x2]))  # one batch: the heads' BN sees both views
    (p1, p2), (z1, z2) = p_.chunk(2), z_.chunk(2)
    assert torch.allclose(got, byol_loss(p1, p2, z1, z2), atol=1e-5)
    assert not torch.allclose(got, byol_loss(p1, p2, z2, z1), atol=1e-3)


def test_the_target_follows_the_online_encoder_by_ema_after_every_step(tmp_path):
    p = params(rounds=1, batch_size=64, target_ema=0.9)  # one step per client (sizes 20-40)
    fed, model = federation(p, tmp_path)
    state = fed.run(fed.start(model))
    g0 = fed.strategy.init_server(seeded_byol(p.model, SHAPE, 0, CPU))["global"]
    for c in range(3):
        kept = state.clients[c]
        for k in (k for k in online_names(model) if k.startswith("encoder.")):
            expected = torch.lerp(g0[k], kept[k], 0.1)  # 0.9·(ξ = θ_g) + 0.1·θ after the step
            assert torch.allclose(kept[TARGET + k], expected, atol=1e-6), k


def test_fedbyol_averages_online_network_and_predictor_and_keeps_the_target_local(tmp_path):
    p = params()
    starts = {}
    state = run(p, tmp_path, spy=lambda r, c, rec, kept, out: starts.setdefault((r, c), out))
    model = seeded_byol(p.model, SHAPE, 0, CPU)
    assert set(state.server["global"]) == {
        k for k in model.state_dict() if not k.startswith(TARGET)
    }
    enc = [k for k in state.server["global"] if k.startswith("encoder.")]
    for c in range(3):
        first, second = starts[(0, c)], starts[(1, c)]
        assert all(torch.equal(first[TARGET + k], first[k]) for k in enc)  # ξ <- θ_g at first
        # later: the target is the client's own, not the global encoder
        assert not torch.equal(second[TARGET + enc[0]], second[enc[0]])


def test_bytes_per_round_are_the_online_network_and_predictor_each_way(tmp_path):
    for cls in (FedBYOLParams, FedEMAParams, FedUParams):
        p = params(cls)
        state = run(p, tmp_path, name=f"{p.name}.pt")
        model = seeded_byol(p.model, SHAPE, 0, CPU)
        sizes = {
            kind: sum(
                v.numel() * v.element_size()
                for k, v in model.state_dict().items()
                if k.startswith(kind + ".")
            )
            for kind in ("encoder", "predictor")
        }
        per_round = sizes["encoder"] + sizes["predictor"]
        assert per_round == payload_bytes(p, SHAPE) == nbytes(state.server["global"])
        for row in state.ledger.summary()["per_client"]:
            assert row["rounds"] == 2
            assert row["up_by_kind"] == row["down_by_kind"] == {k: 2 * v for k, v in sizes.items()}
        assert [r["bytes_up"] for r in state.log] == [3 * per_round] * 2


def test_fedema_with_tau_zero_is_fedbyol_bit_for_bit(tmp_path):
    plain = run(params(rounds=3), tmp_path, "byol.pt")
    ema0 = run(params(FedEMAParams, rounds=3, tau=0.0), tmp_path, "ema0.pt")
    assert_same(plain.server["global"], ema0.server["global"])
    for c in range(3):
        assert_same(plain.clients[c], ema0.clients[c])
    ema = run(params(FedEMAParams, rounds=3, tau=0.7), tmp_path, "ema.pt")
    assert not torch.equal(ema.server["global"][conv(0)], plain.server["global"][conv(0)])


def conv(j: int) -> str:
    return conv_weights(seeded_byol(params().model, SHAPE, 0, CPU))[j]


@pytest.mark.parametrize("mode", ["local_progress", "global_vs_local"])
def test_fedemas_first_blend_has_decay_tau_then_tau_times_the_divergence_ratio(tmp_path, mode):
    p = params(FedEMAParams, rounds=3, tau=0.7, divergence=mode)
    seen, ds = {}, {}
    model = seeded_byol(p.model, SHAPE, 0, CPU)
    convs, online = conv_weights(model), set(online_names(model))

    def spy(r, c, received, kept, start):
        seen[(r, c)] = (received, kept, start)
        if kept is not None:  # the divergence this blend reads
            ds[(r, c)] = (
                divergence(received, kept, convs) if mode == "global_vs_local" else d_last[c]
            )

    fed, _ = federation(p, tmp_path)
    d_last = {}
    keep = fed.strategy.keep

    def keep_and_note(state, c, trained):
        d_last[c] = divergence(trained, seen[(state.round, c)][2], convs)  # from its start
        out = keep(state, c, trained)
        assert state.memo["divergence"][c] == d_last[c]
        return out

    fed.strategy.keep = keep_and_note
    start = fed.strategy.local_start
    fed.strategy.local_start = lambda st, c, rec: (
        spy(st.round, c, rec, st.clients.get(c), out := start(st, c, rec)) or out
    )
    state = fed.run(fed.start(seeded_byol(p.model, SHAPE, 0, CPU)))
    decays = [row.get("decay") for row in state.log]
    assert decays[0] is None and decays[1] == pytest.approx(0.7, rel=1e-12)
    for c in range(3):
        lam = state.memo["scaler"][c]
        assert lam == pytest.approx(0.7 / ds[(1, c)], rel=1e-12)
        for r in (1, 2):
            mu = min(0.7 * ds[(r, c)] / ds[(1, c)], 1.0)
            received, kept, start = seen[(r, c)]
            for k, v in received.items():
                want = (1 - mu) * v + mu * kept[k] if k in online else v  # BN stats: global
                assert torch.allclose(start[k], want, atol=1e-6), (r, c, k)
            for k in kept:
                if k.startswith(TARGET):  # the target is never refreshed from the server
                    assert torch.equal(start[k], kept[k])
    assert decays[2] == pytest.approx(
        sum(min(0.7 * ds[(2, c)] / ds[(1, c)], 1.0) for c in range(3)) / 3, abs=1e-6
    )


def test_fedema_postpones_the_autoscaler_while_a_client_has_not_moved(tmp_path):
    p = params(FedEMAParams, tau=0.7)
    fed, model = federation(p, tmp_path)
    state = fed.start(model)
    g = state.server["global"]
    kept = {**{k: v + 1 for k, v in g.items() if v.is_floating_point()}}
    state.memo["divergence"] = {0: 0.0}
    start = fed.strategy.online_start(state, 0, g, {**g, **kept})
    assert_same(start, g)  # μ = 0: the global model
    assert 0 not in state.memo.get("scaler", {})


@pytest.mark.parametrize("d, local", [(0.5, True), (0.4, True), (0.3999, False), (0.0, False)])
def test_fedu_keeps_its_predictor_at_or_above_the_threshold_and_takes_the_global_below(
    tmp_path, d, local
):
    p = params(FedUParams, dapu_threshold=0.4)
    fed, model = federation(p, tmp_path)
    state = fed.start(model)
    g = state.server["global"]
    mine = {k: v + 1 if v.is_floating_point() else v for k, v in g.items()}
    state.memo["divergence"] = {1: d}
    start = fed.strategy.online_start(state, 1, g, mine)
    for k, v in start.items():
        want = mine[k] if local and k.startswith("predictor.") else g[k]
        assert torch.equal(v, want), k


def test_fedu_reads_the_divergence_of_the_clients_last_training(tmp_path):
    starts = {}

    def spy(r, c, received, kept, start):
        starts[(r, c)] = (received, kept, start)

    state = run(params(FedUParams, dapu_threshold=0.0), tmp_path, "local.pt", spy)
    assert state.log[1]["local_predictor"] == 1.0  # every d > 0
    for c in range(3):
        received, kept, start = starts[(1, c)]
        pred = [k for k in start if k.startswith("predictor.")]
        assert all(torch.equal(start[k], kept[k]) for k in pred)
        enc = [k for k in start if k.startswith("encoder.")]
        assert all(torch.equal(start[k], received[k]) for k in enc)  # θ is replaced
    never = run(params(FedUParams, dapu_threshold=1e9), tmp_path, "global.pt")
    plain = run(params(), tmp_path, "byol.pt")
    assert never.log[1]["local_predictor"] == 0.0
    assert_same(never.server["global"], plain.server["global"])  # μ_th = ∞ is FedBYOL


def test_the_divergence_is_the_mean_l2_over_the_backbones_conv_kernels():
    p = params(model={"arch": "resnet18", "norm": "gn", "channels_per_group": 2, "width": 4,
                      "proj_hidden": 16, "proj_dim": 8})  # fmt: skip
    model = seeded_byol(p.model, SHAPE, 0, CPU)
    keys = conv_weights(model)
    assert len(keys) == 1 + 8 * 2  # stem and both convs of 8 blocks; shortcuts excluded
    a = {k: v.detach() for k, v in model.named_parameters()}
    b = {k: v + (2.0 if k == keys[3] else 0.0) for k, v in a.items()}
    assert divergence(a, b, keys) == pytest.approx(2.0 * math.sqrt(a[keys[3]].numel()) / 17)


def test_a_bad_divergence_or_threshold_is_named():
    with pytest.raises(ValueError, match="divergence"):
        params(FedEMAParams, divergence="paper")
    with pytest.raises(ValueError, match="dapu_threshold"):
        params(FedUParams, dapu_threshold=-1)
    with pytest.raises(ValueError, match="pixels"):
        params(model=ModelParams(arch="pixels").model_dump())


def test_the_paper_scale_payload_is_the_specs_float_count():
    """Spec §2.5: CIFAR ResNet-18 11,168,832 + projector 10,500,096 + predictor 16,791,552
    floats each way per round, plus the BN buffers (which the server averages too)."""
    p = params(model={"arch": "resnet18", "norm": "bn", "width": 64, "proj_hidden": 4096,
                      "proj_dim": 2048})  # fmt: skip
    model = seeded_byol(p.model, (3, 32, 32), 0, CPU)
    travels = {k: v for k, v in model.state_dict().items() if not k.startswith(TARGET)}
    floats = sum(v.numel() for k, v in model.named_parameters() if k in travels)
    assert floats == 11_168_832 + 10_500_096 + 16_791_552 == 38_460_480
    buffers = {k: v for k, v in travels.items() if k not in dict(model.named_parameters())}
    assert payload_bytes(p, (3, 32, 32)) == 4 * floats + nbytes(buffers)
