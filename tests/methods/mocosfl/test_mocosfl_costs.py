"""MocoSFL / MonAcoSFL's costs stage: a client step's FLOPs are its part's (online forward and
backward, momentum forward; the server's counted apart), the smashed data per step follow the
protocol's formula, and each client's bytes by kind come from the ledger."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedssl import costs
from fedssl.fl.cohort import LocalData
from fedssl.methods.mocosfl.costs import client_rows, client_step, projected_rows
from fedssl.methods.mocosfl.nets import build_nets
from tests.methods.mocosfl.test_mocosfl import SHAPE, federation, params, toy_data

CPU = torch.device("cpu")


def conv_flops_per_image(client: nn.Module) -> list[int]:
    """2 x MACs of every convolution of the client part on one image, in call order."""
    flops = []

    def hook(m, _inp, out):
        flops.append(2 * out[0].numel() * (m.in_channels // m.groups) * math.prod(m.kernel_size))

    handles = [m.register_forward_hook(hook) for m in client.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        client(torch.zeros(1, *SHAPE))
    for h in handles:
        h.remove()
    return flops


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_client_step_costs_its_parts_forward_and_backward_only(symmetric):
    """Per image: the online forward F, its backward 2F less the first convolution's
    gradient with respect to the images (none is needed), the momentum forward F, with or
    without the symmetric loss (the server swaps the activations). The server's units and
    projector run on the server and count apart, as its FLOPs on the client's behalf."""
    p = params("mocosfl", cut=3, moco=dict(queue_size=32, symmetric=symmetric))
    nets = build_nets(p, SHAPE, CPU)
    convs = conv_flops_per_image(nets.client)
    rows = p.federation.batch_size
    step = client_step(p, nets, SHAPE)
    assert step["flops_per_step"] == rows * (4 * sum(convs) - convs[0])
    assert step["flops_per_image"] == step["flops_per_step"] / p.federation.batch_size
    # the server's FLOPs on the client's behalf, counted apart: its top's forward F_s, the
    # backward to its weights and to the activations 2 F_s, the momentum top's forward F_s
    with torch.no_grad():
        h = nets.client(torch.zeros(1, *SHAPE))
    assert step["server_flops_per_image"] == 4 * costs.forward_flops(nets.top, h)
    # memory: four copies of the client part, its activations and the gradient back, plus
    # what autograd saves (some of it)
    weights = sum(t.numel() * 4 for t in nets.client.parameters())
    smashed = 2 * rows * math.prod(nets.activation_shape(SHAPE)) * 4
    assert step["step_bytes"] > 4 * weights + smashed


@pytest.mark.parametrize(
    "variant,symmetric,fraction", [("mocosfl", True, 1.0), ("monacosfl", False, 0.67)]
)
def test_smashed_bytes_per_step_follow_the_protocol_and_bytes_come_from_the_ledger(
    tmp_path, variant, symmetric, fraction
):
    """Per full step of B_c images: activations up (query and key rows) and gradients down,
    each B_c x |h| x 4 bytes, with or without the symmetric loss; every client's bytes by kind
    are its ledger's, and its FLOPs scale with the images it processed (2 of 3 clients a round
    in the second case)."""
    p = params(
        variant,
        moco=dict(queue_size=32, symmetric=symmetric),
        federation=dict(client_fraction=fraction),
    )
    fed = federation(p, tmp_path)
    state = fed.run(fed.start(None))
    nets = build_nets(p, SHAPE, CPU)
    ledger = state.ledger.summary()
    images = state.memo["images"]
    rows = client_rows(p, nets, SHAPE, ledger, images)
    act = math.prod(nets.activation_shape(SHAPE))
    batch = p.federation.batch_size
    step = client_step(p, nets, SHAPE)
    for row, logged in zip(rows, ledger["per_client"], strict=True):
        assert row["smashed_bytes_per_step"] == 3 * batch * act * 4  # query, key up; grad down
        assert row["up_by_kind"] == logged["up_by_kind"]
        assert row["down_by_kind"] == logged["down_by_kind"]
        assert row["bytes_exchanged"] == logged["bytes_up"] + logged["bytes_down"]
        assert row["flops"] == pytest.approx(step["flops_per_image"] * images[row["client"]])
        assert row["flops_per_step"] == step["flops_per_step"]
    assert [r["images"] for r in rows] == images
    assert (sorted(images) == [24, 36, 60]) == (fraction == 1.0)  # 2 rounds of 12 / 18 / 30
    assert ("sync_momentum" in rows[0]["up_by_kind"]) == (variant == "monacosfl")


@pytest.mark.parametrize("variant,at_end", [("mocosfl", True), ("monacosfl", False)])
def test_the_projection_is_what_a_run_of_like_clients_pays(tmp_path, variant, at_end):
    """Three clients of 20 images each, all sampled: the projected client's bytes by kind,
    FLOPs and memory are each measured client's, syncs counted across rounds (20 images in
    batches of 6 = 4 steps a round and a sync every 3 steps: 2 syncs a round with one at each
    round's end, else 2 in the 8 steps of the 2 rounds)."""
    p = params(variant, federation=dict(sync_every=3, sync_at_round_end=at_end, rounds=2))
    data = toy_data()
    equal = LocalData(data.images, data.labels, [list(range(i, 60, 3)) for i in range(3)])
    fed = federation(p, tmp_path, data=equal)
    state = fed.run(fed.start(None))
    nets = build_nets(p, SHAPE, CPU)
    measured = client_rows(p, nets, SHAPE, state.ledger.summary(), state.memo["images"])
    (projected,) = projected_rows(p, SHAPE, 20)
    for row in measured:
        for key in ("up_by_kind", "down_by_kind", "bytes_exchanged", "flops", "peak_step_bytes"):
            assert projected[key] == row[key], key
        assert row["rounds"] == projected["rounds"] == 2
    syncs = projected["up_by_kind"]["sync_online"] // (4 * nets.client_numel())
    assert syncs == (4 if at_end else 2)
