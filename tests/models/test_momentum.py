"""EMA updates (scalar and per client), MoCo v3's momentum schedule, the negative queue and its
checkpoint, and MonAcoSFL's misalignment measure."""

from __future__ import annotations

import io

import pytest
import torch

from fedssl.models.momentum import FeatureQueue, ema_update, misalignment, moco_momentum


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---- EMA --------------------------------------------------------------------------------------


def test_ema_update_in_place_with_a_scalar_momentum():
    target = {"w": torch.zeros(2, 3), "b": torch.full((3,), 10.0)}
    online = {"w": torch.ones(2, 3), "b": torch.zeros(3)}
    w_before = target["w"]
    ema_update(target, online, 0.9)
    assert target["w"] is w_before  # updated in place, not replaced
    assert torch.allclose(target["w"], torch.full((2, 3), 0.1))
    assert torch.allclose(target["b"], torch.full((3,), 9.0))
    ema_update(target, online, 0.9)
    assert torch.allclose(target["w"], torch.full((2, 3), 0.19))
    assert torch.equal(online["w"], torch.ones(2, 3))  # the online model is untouched


def test_ema_update_of_parameters_that_require_grad_records_no_graph():
    target = {"w": torch.zeros(3, requires_grad=True)}
    online = {"w": torch.ones(3, requires_grad=True)}
    ema_update(target, online, 0.5)
    assert torch.allclose(target["w"].detach(), torch.full((3,), 0.5))
    assert target["w"].grad_fn is None


def test_ema_update_with_one_momentum_per_client():
    target = {"w": torch.zeros(3, 2, 2)}
    online = {"w": torch.ones(3, 2, 2)}
    ema_update(target, online, torch.tensor([0.0, 0.75, 1.0]))
    assert torch.allclose(target["w"][0], torch.ones(2, 2))  # m = 0: copy
    assert torch.allclose(target["w"][1], torch.full((2, 2), 0.25))  # m = .75
    assert torch.equal(target["w"][2], torch.zeros(2, 2))  # m = 1: frozen


def test_ema_update_copies_integer_buffers():
    target = {"num_batches_tracked": torch.tensor(3), "w": torch.zeros(1)}
    online = {"num_batches_tracked": torch.tensor(8), "w": torch.ones(1)}
    ema_update(target, online, 0.9)
    assert target["num_batches_tracked"].item() == 8
    assert target["w"].item() == pytest.approx(0.1)


def test_the_ema_of_the_mean_is_the_mean_of_the_emas():
    """MonAcoSFL §4.2: the EMA is linear, so averaging the clients' momentum models gives the
    momentum model of the averaged online model, whatever the clients' trajectories."""
    clients, m = 4, 0.9
    momenta = {"w": randn(clients, 5, 3, seed=0)}
    mean_momentum = {"w": momenta["w"].mean(0)}
    for step in range(6):
        online = {"w": randn(clients, 5, 3, seed=100 + step)}
        ema_update(momenta, online, m)
        ema_update(mean_momentum, {"w": online["w"].mean(0)}, m)
    assert torch.allclose(momenta["w"].mean(0), mean_momentum["w"], atol=1e-6)
    assert momenta["w"].std(0).min() > 0.05  # the clients really differ


# ---- momentum schedule ------------------------------------------------------------------------


def test_cosine_momentum_runs_from_base_to_one():
    assert moco_momentum(0, 100, 0.99) == pytest.approx(0.99)
    assert moco_momentum(50, 100, 0.99) == pytest.approx(0.995)
    assert moco_momentum(100, 100, 0.99) == pytest.approx(1.0)
    values = [moco_momentum(s, 100, 0.9) for s in range(101)]
    assert all(a <= b for a, b in zip(values, values[1:]))
    assert moco_momentum(25, 100, 0.9) == pytest.approx(1 - 0.1 * (1 + 2**-0.5) / 2)


def test_constant_momentum_stays_at_base():
    assert {moco_momentum(s, 100, 0.99, cosine=False) for s in (0, 37, 100)} == {0.99}


# ---- negative queue ---------------------------------------------------------------------------


def test_queue_starts_as_seeded_unit_vectors():
    q = FeatureQueue(32, 8, seed=3)
    assert q.keys.shape == (32, 8) and len(q) == 32 and q.ptr == 0
    assert torch.allclose(q.keys.norm(dim=1), torch.ones(32), atol=1e-6)
    assert torch.equal(q.keys, FeatureQueue(32, 8, seed=3).keys)
    assert not torch.allclose(q.keys, FeatureQueue(32, 8, seed=4).keys)


def test_queue_push_is_fifo_wraps_around_and_normalises():
    q = FeatureQueue(5, 2, seed=0)
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    b = torch.tensor([[0.0, 1.0], [1.0, 1.0], [-1.0, 0.0], [0.0, -4.0]])
    q.push(a)
    assert q.ptr == 3
    q.push(b)  # rows 3, 4, then wraps to 0, 1
    unit = torch.nn.functional.normalize
    expected = unit(torch.stack([b[2], b[3], a[2], b[0], b[1]]), dim=1)
    assert torch.allclose(q.keys, expected) and q.ptr == 2


def test_queue_push_longer_than_the_queue_keeps_the_newest_rows():
    q = FeatureQueue(5, 2, seed=0)
    q.push(torch.tensor([[1.0, 0.0], [1.0, 0.0]]))  # ptr 2
    angles = torch.arange(7.0) * 0.3  # seven distinct unit vectors c0..c6
    c = torch.stack([angles.cos(), angles.sin()], dim=1)
    q.push(c)
    # row j of c lands at (2 + j) % 5; the last five (j = 2..6) survive
    assert torch.allclose(q.keys, c[[3, 4, 5, 6, 2]], atol=1e-6) and q.ptr == 4


def test_queue_push_drops_padded_rows():
    q = FeatureQueue(4, 2, seed=0)
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    q.push(keys, valid=torch.tensor([True, False, True]))
    assert q.ptr == 2
    assert torch.allclose(q.keys[1], torch.tensor([1.0, 1.0]) / 2**0.5)


def test_queue_restores_exactly_from_its_state_dict():
    q = FeatureQueue(7, 4, seed=1)
    q.push(randn(5, 4, seed=2))
    q.push(randn(4, 4, seed=3))
    buf = io.BytesIO()
    torch.save(q.state_dict(), buf)
    saved = q.state_dict()
    q.push(randn(1, 4, seed=9))  # later pushes do not alter a taken state
    assert not torch.equal(saved["keys"], q.keys)

    buf.seek(0)
    resumed = FeatureQueue(7, 4, seed=123)
    resumed.load_state_dict(torch.load(buf))
    q.load_state_dict(saved)
    for step in range(3):  # both continue identically
        keys = randn(3, 4, seed=50 + step)
        q.push(keys)
        resumed.push(keys)
    assert torch.equal(resumed.keys, q.keys) and resumed.ptr == q.ptr == (2 + 9) % 7


def test_queue_refuses_a_state_of_another_shape():
    with pytest.raises(ValueError, match="shape"):
        FeatureQueue(4, 2, seed=0).load_state_dict(FeatureQueue(5, 2, seed=0).state_dict())


# ---- misalignment (MonAcoSFL Eq. 2) -----------------------------------------------------------


def test_misalignment_of_identical_models_is_zero():
    online = [{"w": randn(3, 3, seed=s), "b": randn(3, seed=s + 10)} for s in range(3)]
    copies = [{k: v.clone() for k, v in d.items()} for d in online]
    assert misalignment(online, copies).item() == 0.0
    assert misalignment(online, copies, squared=True).item() == 0.0


def test_misalignment_hand_value():
    online = [
        {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])},
        {"w": torch.tensor([3.0, 3.0]), "b": torch.tensor([3.0])},
    ]
    momentum = [
        {"w": torch.tensor([0.0, 2.0]), "b": torch.tensor([1.0])},
        {"w": torch.tensor([3.0, 1.0]), "b": torch.tensor([3.0])},
    ]
    # |diffs| client 1: 1, 0, 1; client 2: 0, 2, 0 -> 4 / (N=2 * dim=3)
    assert misalignment(online, momentum).item() == pytest.approx(4 / 6)
    # squared: 1 + 0 + 1 + 0 + 4 + 0 = 6 -> 6 / 6
    assert misalignment(online, momentum, squared=True).item() == pytest.approx(1.0)


def test_syncing_only_online_models_misaligns_them_and_aligning_momentum_does_not():
    """The MonAcoSFL story in numbers: clients drift apart, each momentum model tracks its own
    online model; a FedAvg sync of the online models alone leaves every momentum model far from
    the new online weights, while averaging the momentum models too keeps them close."""
    clients = 5
    online = [{"w": randn(50, seed=s) * 3} for s in range(clients)]
    momentum = [{"w": o["w"] + 0.01 * randn(50, seed=100 + i)} for i, o in enumerate(online)]
    before = misalignment(online, momentum).item()
    synced = [{"w": torch.stack([o["w"] for o in online]).mean(0)} for _ in range(clients)]
    mocosfl = misalignment(synced, momentum).item()
    aligned = [{"w": torch.stack([m["w"] for m in momentum]).mean(0)} for _ in range(clients)]
    monacosfl = misalignment(synced, aligned).item()
    assert monacosfl <= before + 1e-9  # triangle inequality: averaging cannot add drift
    assert mocosfl > 100 * before
