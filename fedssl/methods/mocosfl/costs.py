"""The ``costs`` stage of MocoSFL / MonAcoSFL: what one client pays in split learning.

* Bytes: up and down by kind from the run's ledger (activations of the query and key views,
  the gradients returned, the synced models).
* FLOPs: counted around one client step at the real batch: the online client part's forward
  and backward (from the activation gradients the server returns) on the query rows, and the
  momentum client part's forward on the key rows. The server's part (its units and projector:
  forward and backward to the activations on the query rows, the momentum top's forward on
  the key rows; the loss's queue products left out) is counted apart, as the server FLOPs
  spent on that client (``server_flops``). Per image x the images the client processed.
* Memory: that step's saved activations, the activations it holds and the gradient it
  receives, plus the client part four times over (online, momentum, gradient, SGD momentum).

The projection (``fedssl costs``) counts the same for the average client at full
scale from the protocol's formula (:mod:`fedssl.methods.mocosfl.comm`), without training.
"""

from __future__ import annotations

import json
import math

import torch

from fedssl import costs
from fedssl.data.catalog import dataset_spec
from fedssl.methods.mocosfl import MocoSfl
from fedssl.methods.mocosfl.comm import ACT_KEY, ACT_QUERY, FLOAT_BYTES, GRADIENTS, protocol_bytes
from fedssl.methods.mocosfl.nets import SplitNets, build_nets
from fedssl.methods.mocosfl.schedule import sync_due
from fedssl.stage.contract import StepContext

SMASHED_UP, SMASHED_DOWN = (ACT_QUERY, ACT_KEY), (GRADIENTS,)
CLIENT_COPIES = 4  # online, momentum, gradient, SGD momentum


def client_step(p, nets: SplitNets, image_shape) -> dict:
    """FLOPs and memory of one client step on a fixed probe batch of the step's real size."""
    rows = p.federation.batch_size  # the online model's view and the momentum model's
    gen = torch.Generator().manual_seed(0)
    x = torch.rand((rows, *image_shape), generator=gen)
    returned = torch.randn((rows, *nets.activation_shape(image_shape)), generator=gen)

    def backward_from_server(h, _x):  # d(h . g)/dh = g: the backward of the returned gradient
        return (h * returned).sum()

    client = nets.client.train()
    flops = costs.train_step_flops(client, x, backward_from_server) + costs.forward_flops(client, x)
    with torch.no_grad():
        h = client(x)
    top = nets.top.train()
    h_grad = h.clone().requires_grad_(True)  # the server returns the activations' gradient
    server = costs.train_step_flops(top, h_grad) + costs.forward_flops(top, h)
    weights = costs.tensor_bytes(client.parameters())
    smashed = 2 * returned.numel() * FLOAT_BYTES  # its activations and the gradient back
    saved = costs.saved_activation_bytes(client, x, backward_from_server)
    return {
        "flops_per_step": flops,
        "flops_per_image": flops / p.federation.batch_size,
        "server_flops_per_image": server / p.federation.batch_size,
        "step_bytes": int(saved + smashed + CLIENT_COPIES * weights),
    }


def smashed_bytes_per_step(ledger_rows: list[dict], images: int, batch_size: int) -> float:
    """Activation bytes up plus gradient bytes down of one client's full step (B_c images), from
    what all clients sent over the run (the same for every client; 0 before any step)."""
    up = sum(r["up_by_kind"].get(k, 0) for r in ledger_rows for k in SMASHED_UP)
    down = sum(r["down_by_kind"].get(k, 0) for r in ledger_rows for k in SMASHED_DOWN)
    return (up + down) / images * batch_size if images else 0.0


def client_rows(p, nets: SplitNets, image_shape, ledger: dict, images: list[int]) -> list[dict]:
    """One row per client: its ledger's bytes by kind, its FLOPs and its step's memory."""
    step = client_step(p, nets, image_shape)
    smashed = smashed_bytes_per_step(ledger["per_client"], sum(images), p.federation.batch_size)
    rows = []
    for row in ledger["per_client"]:
        c = row["client"]
        rows.append(
            {
                "client": c,
                "samples": row["samples"],
                "rounds": row["rounds"],
                "images": images[c],
                "bytes_up": row["bytes_up"],
                "bytes_down": row["bytes_down"],
                "bytes_exchanged": row["bytes_up"] + row["bytes_down"],
                "up_by_kind": row["up_by_kind"],
                "down_by_kind": row["down_by_kind"],
                "smashed_bytes_per_step": smashed,
                "flops_per_step": step["flops_per_step"],
                "flops": step["flops_per_image"] * images[c],
                "server_flops": step["server_flops_per_image"] * images[c],
                "peak_step_bytes": step["step_bytes"],
            }
        )
    return rows


def client_costs(ctx: StepContext) -> list[dict]:
    p, pretrain = ctx.exp.method, ctx.input("pretrain")
    ledger = json.loads((pretrain / "communication.json").read_text())
    check = json.loads((pretrain / "communication_check.json").read_text())
    images = [0] * len(ledger["per_client"])
    for row in check["per_client"]:
        images[row["client"]] = row["images"]
    nets = build_nets(p, ctx.image_shape, torch.device("cpu"))
    return client_rows(p, nets, ctx.image_shape, ledger, images)


def syncs_per_run(steps_per_round: int, rounds: int, t) -> int:
    """The cohort's syncs over ``rounds`` rounds of ``steps_per_round`` steps under the
    training settings ``t``, by the trainer's rule (:func:`sync_due`)."""
    syncs = since = 0
    for _ in range(rounds):
        for s in range(steps_per_round):
            since += 1
            if sync_due(since, t.sync_every, t.sync_at_round_end, s + 1 == steps_per_round):
                syncs, since = syncs + 1, 0
    return syncs


def projected_rows(p, image_shape, samples: int) -> list[dict]:
    """The costs row of a client holding ``samples`` images in a cohort of clients like it:
    sampled in rho x rounds rounds, one pass over its data each, in the cohort's syncs of those
    rounds; a sampled round after one it sat out starts with a catch-up download (expected
    rho R (1 - rho) of them: an estimate where rho < 1)."""
    t = p.federation
    rounds = round(t.client_fraction * t.rounds)
    steps = math.ceil(samples / t.batch_size)
    syncs = syncs_per_run(steps, t.rounds, t) * rounds // max(t.rounds, 1)
    catch_ups = round(rounds * (1 - t.client_fraction))
    nets = build_nets(p, image_shape, torch.device("cpu"))
    act = math.prod(nets.activation_shape(image_shape))
    sent = protocol_bytes(
        samples * rounds,
        act,
        syncs,
        catch_ups,
        nets.client_numel(),
        p.variant == "monacosfl",
    )
    ledger = {
        "per_client": [
            {
                "client": 0,
                "samples": samples,
                "rounds": rounds,
                "bytes_up": sum(sent["up"].values()),
                "bytes_down": sum(sent["down"].values()),
                "up_by_kind": sent["up"],
                "down_by_kind": sent["down"],
            }
        ]
    }
    return client_rows(p, nets, image_shape, ledger, [samples * rounds])


def projected_costs(exp, part, dataset: str) -> dict:
    """The average client at full scale (see :func:`projected_rows`)."""
    p, shape = exp.method, dataset_spec(dataset).shape
    rows = projected_rows(p, shape, costs.average_client_samples(part, dataset))
    return costs.summarize_client_costs(rows, MocoSfl.cost_columns)
