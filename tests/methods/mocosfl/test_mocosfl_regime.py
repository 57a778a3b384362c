"""MocoSFL / MonAcoSFL in the paper's regime: the two misalignment measures of the step log
(Eq. 2's and the one the authors' code logs), each against a hand computation from the
models the trainer held; the clients' per-step cosine rate; the options' defaults."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedssl.fl.cohort import OptimizerConfig, StackedOptimizer
from fedssl.methods.mocosfl import MocoSflParams
from tests.methods.mocosfl.test_mocosfl import federation, params
from tests.methods.mocosfl.test_mocosfl_rules import spy_models


def snapshot_models(fed):
    """Copies of the round's stacked online and momentum client models after every step (before
    its sync) and after every sync, taken from the trainer's own tensors."""

    def copy(online, momentum):
        return {k: v.clone() for k, v in online.items()}, {
            k: v.clone() for k, v in momentum.items()
        }

    return spy_models(fed, copy)


def by_hand(models, squared: bool) -> float:
    """Mean over every client and parameter element of |online - momentum| (or its square)."""
    online, momentum = models
    diffs = torch.cat([(online[k].double() - momentum[k].double()).flatten() for k in online])
    return float((diffs.square() if squared else diffs.abs()).mean())


@pytest.mark.parametrize("variant", ["mocosfl", "monacosfl"])
def test_each_misalignment_column_is_what_its_name_says(tmp_path, variant):
    """2 of 3 clients a round, a sync every 3 steps: `misalignment_sq_pre_sync` (the authors'
    log) is the squared difference of the round's clients after the step and before its sync,
    at every step; `misalignment` (Eq. 2) the absolute one after the sync."""
    p = params(variant, federation=dict(rounds=2, sync_every=3, client_fraction=0.67))
    fed = federation(p, tmp_path)
    after_step, after_sync = snapshot_models(fed)
    log = fed.run(fed.start(None)).memo["steps"]
    assert [e["step"] for e in log] == list(range(1, len(after_step) + 1))
    synced = iter(after_sync)
    for entry, models in zip(log, after_step, strict=True):
        after = next(synced) if entry["sync"] else models
        assert entry["misalignment_sq_pre_sync"] == pytest.approx(by_hand(models, True), rel=1e-9)
        assert entry["misalignment"] == pytest.approx(by_hand(after, False), rel=1e-9)
        assert entry["misalignment_sq"] == pytest.approx(by_hand(after, True), rel=1e-9)
    assert next(synced, None) is None
    # the names tell different numbers apart: squared vs absolute, before vs after a sync
    for e in log:
        assert e["misalignment_sq_pre_sync"] < 0.1 * e["misalignment"]
    pre_post = [(e["misalignment_sq_pre_sync"], e["misalignment_sq"]) for e in log if e["sync"]]
    assert len(pre_post) >= 3 and all(abs(post / pre - 1) > 1e-3 for pre, post in pre_post)


def test_the_authors_misalignment_is_summarised_over_every_step(tmp_path):
    from fedssl.methods.mocosfl import outputs as sfl
    from fedssl.methods.mocosfl.nets import build_nets
    from tests.methods.mocosfl.test_mocosfl import SHAPE

    p = params("mocosfl", federation=dict(rounds=2, sync_every=3))
    fed = federation(p, tmp_path)
    state = fed.run(fed.start(None))
    summary = sfl.summarize(
        p, build_nets(p, SHAPE, torch.device("cpu")), SHAPE, state, [12, 18, 30]
    )
    steps = state.memo["steps"]
    assert summary["mis_sq_pre_sync_mean"] == pytest.approx(
        sum(s["misalignment_sq_pre_sync"] for s in steps) / len(steps)
    )
    syncs = [s for s in steps if s["sync"]]
    assert summary["mis_after_sync_mean"] == pytest.approx(
        sum(s["misalignment"] for s in syncs) / len(syncs)
    )


# ------------------------------------------------------------------ the clients' rate
def cosine(lr: float, period: int, s: int) -> float:
    return lr * (1 + math.cos(math.pi * s / period)) / 2


def test_each_client_steps_its_own_cosine_over_its_own_steps(tmp_path):
    """[code] CosineAnnealingLR stepped per client step: a client's rate at its s-th step is
    lr (1 + cos(pi s / T)) / 2, s counted over the rounds it was sampled in (not the global
    step); the server keeps the round's rate."""
    period, lr = 4, 0.1
    p = params(
        "mocosfl",
        federation=dict(
            rounds=3,
            client_fraction=0.67,
            lr=lr,
            lr_schedule="constant",
            client_lr_schedule="step_cosine",
            client_lr_period=period,
        ),
    )
    fed = federation(p, tmp_path)
    rates, step = [], fed.trainer.step

    def spy_step(run, batch):
        rates.append((list(batch.clients), batch.lr, batch.client_lr))
        return step(run, batch)

    fed.trainer.step = spy_step
    fed.run(fed.start(None))
    taken: dict[int, int] = {}
    for clients, server_lr, client_lr in rates:
        assert server_lr == lr
        expected = [cosine(lr, period, taken.get(c, 0)) for c in clients]
        assert client_lr.tolist() == pytest.approx(expected, rel=1e-6)
        for c in clients:
            taken[c] = taken.get(c, 0) + 1
    # the clients' histories differ, so their rates differ within a step
    assert any(len(set(r[2].tolist())) > 1 for r in rates)
    assert max(taken.values()) > 2 * period  # past T the rate climbs again (periodic)


def test_one_rate_per_client_row_is_the_rows_own_update():
    opt = StackedOptimizer(OptimizerConfig("sgd", weight_decay=5e-4, momentum=0.9))
    gen = torch.Generator().manual_seed(0)
    params_ = {"w": torch.randn(3, 4, 2, generator=gen), "b": torch.randn(3, 5, generator=gen)}
    grads = {k: torch.randn(v.shape, generator=gen) for k, v in params_.items()}
    rates = torch.tensor([0.1, 0.02, 0.3])
    together = {k: v.clone() for k, v in params_.items()}
    state = opt.init(together)
    opt.step(together, grads, state, rates)
    for i, rate in enumerate(rates.tolist()):
        row = {k: v[i : i + 1].clone() for k, v in params_.items()}
        opt.step(row, {k: g[i : i + 1] for k, g in grads.items()}, opt.init(row), rate)
        for k in row:
            assert torch.equal(row[k][0], together[k][i]), (i, k)


def test_a_cosine_that_never_turns_equals_the_rounds_constant_rate_bit_for_bit(tmp_path):
    """The per-row path changes nothing else: a period so long that cos(pi s / T) rounds to 1
    gives the same run as the clients stepping the (constant) round rate."""
    flat = dict(rounds=2, client_fraction=0.67, lr_schedule="constant")
    a = federation(params("monacosfl", federation=flat), tmp_path, name="a.pt")
    b = federation(
        params(
            "monacosfl",
            federation={**flat, "client_lr_schedule": "step_cosine", "client_lr_period": 10**12},
        ),
        tmp_path,
        name="b.pt",
    )
    sa, sb = a.run(a.start(None)), b.run(b.start(None))
    for c, kept in sa.clients.items():
        for k, v in kept.items():
            assert torch.equal(v, sb.clients[c][k]), (c, k)
    assert [e["loss"] for e in sa.memo["steps"]] == [e["loss"] for e in sb.memo["steps"]]


def test_the_regime_options_default_to_the_old_behaviour_and_are_checked():
    p = params()
    t = p.federation
    assert t.client_lr_schedule == "round" and t.client_lr_period is None
    assert t.round_steps == "longest"
    assert p.inversion.aux_fraction == 0.01 and p.inversion.epochs == 50  # the paper's
    assert p.moco.symmetric
    raw = params().model_dump()
    raw["federation"]["client_lr_period"] = 800
    with pytest.raises(ValueError, match="client_lr_period"):
        MocoSflParams.model_validate(raw)


def test_equal_round_steps_give_every_client_the_mean_clients_steps_over_its_own_images():
    """Clients of 12, 18 and 30 images at B_c 6: one pass each is 2, 3 and 5 steps, so the
    round lasts 5 steps and the largest client sets it; with equal steps every client takes
    the mean client's ceil(20 / 6) = 4, the small one cycling through its images in a fresh
    shuffle, the large one seeing 4 of its 5 batches. Clients of one size: the same batches."""
    from fedssl.methods.mocosfl.schedule import round_schedules
    from fedssl.methods.mocosfl.train import sfl_config
    from tests.methods.mocosfl.test_mocosfl import toy_data

    clients = toy_data().clients
    longest = sfl_config(params()).schedule
    equal = sfl_config(params(federation=dict(round_steps="equal"))).schedule
    assert [len(s) for s in round_schedules(clients, longest, 0, [0, 1, 2])] == [2, 3, 5]
    schedules = round_schedules(clients, equal, 0, [0, 1, 2])
    assert [len(s) for s in schedules] == [4, 4, 4]
    small = np.concatenate(schedules[0])
    assert sorted(small[:12]) == sorted(small[12:]) == sorted(clients[0])  # two passes
    assert not np.array_equal(small[:12], small[12:])  # each in its own shuffle
    large = round_schedules(clients, longest, 0, [0, 1, 2])[2]
    assert all(np.array_equal(a, b) for a, b in zip(schedules[2], large[:4]))
    same_size = [clients[2][:15], clients[2][15:]]
    for a, b in zip(
        round_schedules(same_size, equal, 1, [4, 7]), round_schedules(same_size, longest, 1, [4, 7])
    ):
        assert len(a) == len(b) == 3 and all(np.array_equal(x, y) for x, y in zip(a, b))
