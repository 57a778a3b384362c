"""MpFedcon's defining rules (spec methods/mpfedcon.md, A2), each in a test that fails when the
rule changes by one line: z_con comes from the frozen round-start network, whose head is the
party's own; FedPer trains all its layers together."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedssl.fl.cohort import Batch
from fedssl.methods.mpfedcon import run as R
from fedssl.methods.mpfedcon import train as T
from fedssl.methods.mpfedcon.nets import build_net
from tests.fixtures import cloned, spy_local_rounds, toy_images
from tests.methods.mpfedcon.test_mpfedcon import CPU, params, run, toy_federation

pytestmark = pytest.mark.usefixtures("one_thread")
SHAPE = (1, 28, 28)


def copy_of(p, state: dict, prefix: str):
    """An independent network holding the ``prefix`` weights of an Anchored state."""
    net = build_net(p, SHAPE, 4)
    net.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
    return net.eval()


def test_z_con_is_the_projection_of_the_frozen_round_start_network():
    """Eq. 5 by hand with two separate networks: z from the live one, z_con from the anchor
    (the round-start model); the body loss is CE + mu l_con of exactly these."""
    p, mu, tau = params("mpfedcon"), 2.0, 0.5
    model = R.seeded_model(p, SHAPE, 4, CPU)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    for k, v in state.items():  # the live network has moved away from its round-start copy
        if k.startswith("net."):
            state[k] = v + 0.2 * torch.randn(v.shape, generator=g)
    buffers = {"centres": torch.randn(4, 8, generator=g), "has_centre": torch.ones(4)}
    weights = {k: v for k, v in state.items() if k not in buffers}
    images, labels = toy_images(8, 0)
    x = torch.from_numpy(images[:, None]).float() / 255
    batch = Batch((x,), torch.from_numpy(labels), torch.ones(8, dtype=torch.bool))
    with torch.no_grad():
        live, anchor = copy_of(p, state, "net."), copy_of(p, state, "anchor.")
        z, z_con = live.project(x), anchor.project(x)
        _, z_model, z_con_model = functional_call(model, (weights, buffers), (x, True))
        got = T.contrast_loss(mu, tau)(model, weights, buffers, batch)
    assert torch.allclose(z_model, z, atol=1e-6)
    assert torch.allclose(z_con_model, z_con, atol=1e-6)
    assert not torch.allclose(z_con, z, atol=1e-2)
    pos = F.cosine_similarity(z, buffers["centres"][batch.labels]) / tau
    neg = F.cosine_similarity(z, z_con) / tau
    l_con = (torch.logaddexp(pos, neg) - pos).mean()
    ce = F.cross_entropy(live(x), batch.labels)
    assert torch.allclose(got, ce + mu * l_con, atol=1e-5)


def test_the_anchor_is_the_partys_own_round_start_network(tmp_path):
    """After a round every party holds a head of its own: the next round's anchor has that
    head (not the server's initial one) on the base just received; with neg_source prev_local
    its base is the party's previous local base instead (A2)."""
    fed, state = run(tmp_path, params("mpfedcon", rounds=1))
    s, glob = fed.strategy, state.server["global"]
    for c in range(3):
        start = s.local_start(state, c, s.download(state, c))
        for k in s.personal:
            anchor = start["anchor." + k[len("net.") :]]
            assert torch.equal(anchor, state.clients[c][k]), (c, k)
            if k.endswith("weight"):
                assert not torch.equal(anchor, glob[k]), (c, k)  # the initial head
        for k in s.shared:
            assert torch.equal(start["anchor." + k[len("net.") :]], glob[k]), (c, k)
            assert torch.equal(start[k], glob[k]), (c, k)

    fed, state = run(tmp_path, params("mpfedcon", rounds=1, neg_source="prev_local"), "prev.pt")
    s, glob = fed.strategy, state.server["global"]
    start = s.local_start(state, 0, s.download(state, 0))
    for k in s.shared:
        anchor = start["anchor." + k[len("net.") :]]
        assert torch.equal(anchor, state.clients[0]["prev." + k]), k
        if k.endswith("weight"):
            assert not torch.equal(anchor, glob[k]), k  # not the new average


def test_the_anchor_stays_frozen_through_both_phases(tmp_path):
    """What a party uploads after its round: the base moved, the anchor is still the network
    the round started from."""
    fed, model = toy_federation(tmp_path, params("mpfedcon", rounds=1))
    s, seen = fed.strategy, spy_local_rounds(fed)
    fed.run(fed.start(model))
    for c in range(3):
        start, trained = seen[("start", c)], seen[("trained", c)]
        for k in s.keys:
            a = "anchor." + k[len("net.") :]
            assert torch.equal(trained[a], start[k]), (c, a)
        assert not torch.equal(trained[s.shared[0]], start[s.shared[0]])


def test_fedper_trains_base_and_head_together_in_one_pass(tmp_path):
    """FedPer (unlike FedRep) has no head-first phase: one pass of body_epochs over every layer,
    so its head and base both move, and its local schedule is body_epochs long."""
    fed, model = toy_federation(tmp_path, params("fedper", head_epochs=3, body_epochs=1))
    assert fed.trainer.local_epochs == 1
    state = fed.start(model)
    s = fed.strategy
    start = s.local_start(state, 0, s.download(state, 0))
    (phase,) = fed.trainer.phases
    trained, _ = phase.cohort.train(
        [start], fed.data, [0], 0.05, (0,), torch.Generator().manual_seed(0), phase.trainable(state)
    )
    for k in (s.shared[0], s.personal[0]):
        assert not torch.equal(trained[k][0], start[k]), k


def test_uploaded_centres_are_class_means_of_the_trained_network(tmp_path):
    """Eq. 3 after training: c_i[k] = mean of P(D(x)) over the party's class-k images (no
    augmentation), through the network the party just trained, not the one it started with."""
    fed, model = toy_federation(tmp_path, params("mpfedcon", rounds=1))
    s, seen = fed.strategy, {}
    upload = s.upload

    def spy_upload(state, c, trained):
        seen[c] = cloned(trained), cloned(upload(state, c, trained))
        return seen[c][1]

    s.upload = spy_upload
    fed.run(fed.start(model))
    for c, (trained, sent) in seen.items():
        net = copy_of(fed.strategy.p, trained, "net.")
        idx = torch.as_tensor(fed.data.clients[c])
        with torch.no_grad():
            z = net.project(fed.data.images[idx].float() / 255)
        y = fed.data.labels[idx]
        for row, k in enumerate(sent["centre_classes"].tolist()):
            assert torch.allclose(sent["centres"][row], z[y == k].mean(0), atol=1e-5), (c, k)
