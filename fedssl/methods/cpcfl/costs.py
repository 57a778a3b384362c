"""CP-CFL's `costs` stage and projection: per-sample FLOPs of its local steps (full, head-only,
selection forward), the measured step memory and the model pool's traffic."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fedssl import costs
from fedssl.data.catalog import dataset_spec
from fedssl.fl.state import model_state, nbytes
from fedssl.methods.cpcfl.federation import build_net
from fedssl.methods.cpcfl.models import seeded

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def _step_costs(p, shape, num_classes: int):
    """Per-sample FLOPs of a full local step, a head-only step (frozen encoder: no encoder
    backward) and a selection forward; the measured memory of one full step."""
    net = seeded(lambda: build_net(p, shape, num_classes, torch.device("cpu")), p.seed, "cost")
    net.train()
    k = costs.PROBE_PAIRS * 2
    probe = costs.probe_batch(shape)
    target = torch.arange(k) % num_classes

    def ce(out, _x):
        return F.cross_entropy(out, target)

    full = costs.train_step_flops(net, probe, ce) / k
    peak = costs.measured_step_bytes(
        net, probe, ce, optimizer_slots=2, batch_scale=p.federation.batch_size / k
    )
    for name, q in net.named_parameters():
        q.requires_grad_(name.startswith("head."))
    head = costs.train_step_flops(net, probe, ce) / k
    forward = costs.forward_flops(net.eval(), probe) / k
    n_params = sum(q.numel() for q in net.parameters())
    return full, head, forward, peak, n_params, nbytes(model_state(net))


def _rows(p, shape, num_classes, samples, feds, bytes_exchanged) -> list[dict]:
    """Per client: traffic by Eqs. 13-15 (T (N+1) S for a pool of N, 2 S T for FedAvg; S in
    32-bit values) and as actually sent, compute (training, plus the N selection forwards per
    exploiting round when N > 1) and memory (a step's peak plus the other N-1 models held)."""
    c = p.federation
    full, head, fwd, peak, n_params, model_bytes = _step_costs(p, shape, num_classes)
    e, ef = c.local_epochs, c.local_epochs if c.encoder_epochs is None else c.encoder_epochs
    rows = []
    for i, n in enumerate(samples):
        bits = flops = 0.0
        for f in feds:
            explore, exploit = f["explore_rounds"][i], f["exploit_rounds"][i]
            clusters = f["clusters"]
            bits += (explore + exploit) * (clusters + 1) * n_params * costs.BITS_PER_FLOAT
            warm = f["name"] == "warmup"  # FedAvg (None): every epoch trains everything
            flops += n * explore * head * e
            flops += n * exploit * (full * e if warm else full * ef + head * (e - ef))
            if clusters > 1:
                flops += n * exploit * clusters * fwd
        rows.append(
            {
                "client": i,
                "samples": n,
                "rounds": sum(f["explore_rounds"][i] + f["exploit_rounds"][i] for f in feds),
                "paper_bits": bits,
                "bytes_exchanged": bytes_exchanged[i],
                "flops": flops,
                "peak_step_bytes": peak + (c.clusters - 1) * model_bytes,
            }
        )
    return rows


def client_costs(ctx: StepContext) -> list[dict]:
    p = ctx.exp.method
    comm = json.loads((ctx.input("cfl") / "communication.json").read_text())
    clients = comm["per_client"]
    num_classes = int(ctx.split("train")[1].max()) + 1
    return _rows(
        p,
        tuple(ctx.image_shape),
        num_classes,
        [r["samples"] for r in clients],
        comm["federations"],
        [r["bytes_up"] + r["bytes_down"] for r in clients],
    )


def projected_costs(exp, part, dataset: str) -> dict:
    """The average client at full scale (all clients every round; no restarts)."""
    p = exp.method
    c = p.federation
    scheme = part.scheme
    n = (
        scheme.major_classes * scheme.major_count
        + (len(scheme.groups[0]) - scheme.major_classes) * scheme.minor_count
        if scheme.kind == "class_groups"
        else costs.average_client_samples(part, dataset)
    )
    rounds = round(c.client_fraction * c.rounds)
    explore = min(c.explore_rounds, rounds)
    feds = [
        {
            "name": "final",
            "clusters": c.clusters,
            "explore_rounds": [explore],
            "exploit_rounds": [rounds - explore],
        }
    ]
    if p.pretrain == "fedavg":
        feds.insert(
            0,
            {
                "name": "warmup",
                "clusters": 1,
                "explore_rounds": [0],
                "exploit_rounds": [p.warmup_rounds or c.rounds],
            },
        )
    shape = dataset_spec(dataset).shape
    _, _, _, _, n_params, _ = _step_costs(p, shape, dataset_spec(dataset).classes)
    sent = sum(
        ((f["explore_rounds"][0] + f["exploit_rounds"][0]) * (f["clusters"] + 1) * n_params * 4)
        for f in feds
    )
    rows = _rows(p, shape, dataset_spec(dataset).classes, [n], feds, [sent])
    return costs.summarize_client_costs(rows)
