"""CP-CFL's defining rules (spec methods/cp-cfl.md, Alg. 2), each in a test that fails when the
rule changes by one line: exploration picks a model at random, whatever the models' losses;
a collapsed pool stops the run and a restart draws new models, at most ``restarts`` times, the
last attempt standing whatever befalls it (IFCA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedssl.methods.cpcfl import trials
from fedssl.methods.cpcfl.encoder_source import check_disjoint
from fedssl.methods.cpcfl.federation import initial_pool
from fedssl.methods.cpcfl.trials import ClusteringFailed, run_rounds, run_trials
from tests.methods.cpcfl.test_cpcfl import (
    SHAPE,
    grouped_data,
    pool_fed,
    pretrained_encoder,
    tiny_exp,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def exploration_choices(tmp_path, p, encoder, name, attempt=0):
    """Every round's choices of a run that explores throughout, and round 0's [client, N]
    training losses of the pool the clients received."""
    fed = pool_fed(tmp_path, p, encoder=encoder, name=name, attempt=attempt)
    state = fed.start(None)
    losses = fed.strategy.train_losses(state, fed.strategy.download(state, 0)).copy()
    rounds = []
    fed.run(state, on_round=lambda s: rounds.append(list(s.memo["last_choice"])))
    return rounds, losses


def test_exploration_picks_models_at_random_not_by_their_loss(tmp_path):
    """While t < T_c a client's n_u is a random draw: it ignores the models (two different
    encoders give the very same choices), is not the lowest-loss model, and changes from round
    to round and from one attempt (restart) to the next."""
    p = tiny_exp(federation={"clusters": 3, "rounds": 2, "explore_rounds": 2})
    a, losses = exploration_choices(tmp_path, p, pretrained_encoder(p), "a.pt")
    other = {k: -v for k, v in pretrained_encoder(p).items()}
    b, other_losses = exploration_choices(tmp_path, p, other, "b.pt")
    assert not np.allclose(losses, other_losses)  # the two pools really differ
    assert a == b
    assert a[0] != np.argmin(losses, axis=1).tolist()
    assert len(set(a[0])) > 1 and a[0] != a[1]
    restarted, _ = exploration_choices(tmp_path, p, pretrained_encoder(p), "c.pt", attempt=1)
    assert restarted != a


def test_a_collapsed_pool_stops_the_run_and_a_restart_draws_a_new_pool(tmp_path):
    """IFCA's restart (spec 8.8): once every client sits on one model for ``patience`` rounds
    after T_c, the run stops with its state; attempt 1 starts from other random models."""
    p = tiny_exp(
        pretrain="none",
        ssl=None,
        federation={"clusters": 2, "rounds": 4, "explore_rounds": 0, "patience": 1},
    )
    one = initial_pool(p, SHAPE, 4, torch.device("cpu"), 0, None)[0]
    twins = [{k: v.clone() for k, v in one.items()} for _ in range(2)]  # ties: all on model 0
    fed = pool_fed(tmp_path, p, pool=twins)
    with pytest.raises(ClusteringFailed) as failed:
        run_rounds(fed, None, "test")
    state = failed.value.state
    assert state.memo["failed_at"] == 1 and state.round == 1  # stopped at once
    again = initial_pool(p, SHAPE, 4, torch.device("cpu"), 1, None)
    first = initial_pool(p, SHAPE, 4, torch.device("cpu"), 0, None)
    for a, b in zip(first, again):
        assert not torch.equal(
            a["encoder.net.features.0.weight"], b["encoder.net.features.0.weight"]
        )


@pytest.mark.parametrize("restarts, collapsing", [(2, {0}), (1, {0, 1})])
def test_the_step_restarts_at_most_restarts_times_and_the_last_attempt_stands(
    tmp_path, monkeypatch, restarts, collapsing
):
    """Attempts whose pool collapses (twin models: every client ties on model 0) fail and are
    kept for their traffic; the next attempt draws a new pool. The last allowed attempt runs
    all its rounds even when it collapses too."""
    from types import SimpleNamespace

    p = tiny_exp(
        pretrain="none",
        ssl=None,
        federation={
            "clusters": 2,
            "rounds": 3,
            "explore_rounds": 0,
            "patience": 1,
            "restarts": restarts,
        },
    )

    def pool(p, shape, num_classes, device, attempt, encoder):
        drawn = initial_pool(p, shape, num_classes, device, attempt, encoder)
        return [drawn[0]] * len(drawn) if attempt in collapsing else drawn

    monkeypatch.setattr(trials, "initial_pool", pool)
    ctx = SimpleNamespace(
        exp=SimpleNamespace(method=p),
        device=torch.device("cpu"),
        resume_path=tmp_path / "cfl.pt",
        fingerprint="fp",
        results_dir=tmp_path,
        out=tmp_path,
    )
    fed, state, failed = run_trials(ctx, grouped_data(), SHAPE, 4, None, None, None)
    assert [prefix for prefix, _, _ in failed] == ["failed0/"]  # one failure kept, then
    assert [s.round for _, _, s in failed] == [1]  # stopped at once
    assert fed.strategy.attempt == 1 and state.round == 3  # attempt 1 ran every round
    assert (state.memo.get("failed_at") is not None) == (1 in collapsing)
    assert (tmp_path / "failed0_rounds.tsv").exists()


def test_public_pretraining_images_must_not_be_client_data():
    """Server-side SSL uses a public slice of the training split that no client holds: any
    overlap stops the stage, naming the partition fields that fix it."""
    from types import SimpleNamespace

    from fedssl.stage.context import StageFailed

    ctx = SimpleNamespace(name="cfl__x", exp=SimpleNamespace(partition="groups"))
    clients = [np.arange(0, 10), np.arange(10, 20)]
    check_disjoint(ctx, np.arange(20, 30), clients)  # disjoint: fine
    with pytest.raises(StageFailed, match="1 images .* server_holdout = ssl.public.size"):
        check_disjoint(ctx, np.arange(19, 29), clients)
