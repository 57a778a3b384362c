"""CP-CFL's defining rules (spec methods/cp-cfl.md, Alg. 2), each in a test that fails when the
rule changes by one line: exploration picks a model at random, whatever the models' losses."""
from __future__ import annotations

import numpy as np
import pytest

from tests.test_cpcfl import pool_fed, pretrained_encoder, tiny_exp

pytestmark = pytest.mark.usefixtures("one_thread")


def exploration_choices(tmp_path, p, encoder, name):
    """Every round's choices of a run that explores throughout, and round 0's [client, N]
    training losses of the pool the clients received."""
    fed = pool_fed(tmp_path, p, encoder=encoder, name=name)
    state = fed.start(None)
    losses = fed.strategy.train_losses(state, fed.strategy.download(state, 0)).copy()
    rounds = []
    fed.run(state, on_round=lambda s: rounds.append(list(s.memo["last_choice"])))
    return rounds, losses


def test_exploration_picks_models_at_random_not_by_their_loss(tmp_path):
    """While t < T_c a client's n_u is a random draw: it ignores the models (two different
    encoders give the very same choices), is not the lowest-loss model, and changes from round
    to round."""
    p = tiny_exp(cfl={"clusters": 3, "rounds": 2, "explore_rounds": 2})
    a, losses = exploration_choices(tmp_path, p, pretrained_encoder(p), "a.pt")
    other = {k: -v for k, v in pretrained_encoder(p).items()}
    b, other_losses = exploration_choices(tmp_path, p, other, "b.pt")
    assert not np.allclose(losses, other_losses)  # the two pools really differ
    assert a == b
    assert a[0] != np.argmin(losses, axis=1).tolist()
    assert len(set(a[0])) > 1 and a[0] != a[1]
