"""The LW-FedSSL family's `costs` stage and projection: each growth stage's local step measured
on the CPU, and the paper's App. A counts (:mod:`fedssl.methods.lwfedssl.paper_costs`)."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedssl import costs
from fedssl.data.catalog import dataset_spec
from fedssl.methods.lwfedssl import paper_costs
from fedssl.methods.lwfedssl.run import initial_online, input_size, learner_of, trained_names
from fedssl.models.mocov3 import MocoV3Learner

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


class _TwoViews(nn.Module):
    """A learner as a one-input module (the shared meters' interface): the input holds view 1
    then view 2."""

    def __init__(self, learner: MocoV3Learner):
        super().__init__()
        self.learner = learner

    def forward(self, x):
        return self.learner(*x.chunk(2))


def measure_stage(p, image_shape, s: int | None, model: nn.Module | None = None) -> dict:
    """One local step at stage s, measured on the CPU on a probe batch: FLOPs per sample
    (FlopCounterMode, forward + backward, frozen prefix under no_grad), and the step's memory
    at the real batch size: the activations autograd keeps (scaled from the probe) + every
    tensor of the learner (online, momentum and global copies) + gradient and two AdamW slots
    per trained weight."""
    plan, st = p.plan(s), p.settings(s)
    depth = p.vit.depth if (s is None) else s
    model = model or initial_online(p, image_shape, depth)
    learner = learner_of(p, model, s, plan).train()
    train = trained_names(learner, plan, s)
    for name, q in learner.named_parameters():
        q.requires_grad_(name in train)
    size = input_size(p, image_shape)
    pairs = costs.PROBE_PAIRS
    x = torch.rand(
        (2 * pairs, int(image_shape[0]), size, size), generator=torch.Generator().manual_seed(0)
    )
    wrapped = _TwoViews(learner)
    flops = costs.train_step_flops(wrapped, x, lambda out, _x: out) / pairs
    acts = costs.saved_activation_bytes(wrapped, x, lambda out, _x: out)
    tensors = sum(t.numel() * t.element_size() for t in learner.state_dict().values())
    trained = sum(q.numel() * q.element_size() for n, q in learner.named_parameters() if n in train)
    return {
        "flops_per_sample": flops,
        "peak_bytes": int(acts * st.batch_size / pairs + tensors + 3 * trained),
        "paper_flops_per_round": paper_costs.growth_round_flops(
            plan, cost_parts(p, image_shape), s or 1, p.vit.depth
        ),
    }


def cost_parts(p, image_shape) -> paper_costs.VitCostParts:
    v = p.vit
    return paper_costs.vit_cost_parts(
        input_size(p, image_shape),
        v.patch_size,
        int(image_shape[0]),
        v.width,
        int(round(v.width * v.mlp_ratio)),
        v.pool == "cls",
        v.head_hidden,
        v.head_out,
    )


def _client_rows(p, image_shape, samples: list[int], ledgers: list[list[dict]]) -> list[dict]:
    """Per-client costs from each stage's ledger rows (``ledgers[stage][client]``: rounds and
    bytes by kind, as the engine's Ledger.summary writes them)."""
    measured = [measure_stage(p, image_shape, s) for s in p.growth_stages()]
    rows = []
    for c, n in enumerate(samples):
        row = {
            "client": c,
            "samples": n,
            "rounds_taken": 0,
            "bytes_exchanged": 0,
            "flops": 0.0,
            "paper_flops": 0.0,
            "peak_step_bytes": 0,
            "encoder_bytes": 0,
            "encoder_bytes_down": 0,
            "encoder_bytes_up": 0,
            "block_bytes": 0,
        }
        for s, m, ledger in zip(p.growth_stages(), measured, ledgers):
            entry = ledger[c]
            r = entry["rounds"]
            down, up = entry["down_by_kind"], entry["up_by_kind"]
            row["rounds_taken"] += r
            row["bytes_exchanged"] += entry["bytes_up"] + entry["bytes_down"]
            row["flops"] += m["flops_per_sample"] * n * p.settings(s).local_epochs * r
            row["paper_flops"] += m["paper_flops_per_round"] * r
            if r:
                row["peak_step_bytes"] = max(row["peak_step_bytes"], m["peak_bytes"])
            enc_down = down.get("blocks", 0) + down.get("embedding", 0)
            enc_up = up.get("blocks", 0) + up.get("embedding", 0)
            row["encoder_bytes_down"] += enc_down
            row["encoder_bytes_up"] += enc_up
            row["encoder_bytes"] += enc_down + enc_up
            row["block_bytes"] += down.get("blocks", 0) + up.get("blocks", 0)
        rows.append(row)
    return rows


def client_costs(ctx: StepContext) -> list[dict]:
    p = ctx.exp.method
    ledgers = [
        json.loads((ctx.input(step) / "communication.json").read_text())["per_client"]
        for step in ctx.method.costs_inputs_for(p)
    ]
    return _client_rows(p, ctx.image_shape, [len(c) for c in ctx.clients()], ledgers)


def projected_costs(exp, part, dataset: str) -> dict:
    """The average client at full scale, every client in every round (bytes from the plan,
    FLOPs and memory measured on one probe step per stage)."""
    p = exp.method
    shape = dataset_spec(dataset).shape
    n = costs.average_client_samples(part, dataset)
    parts = cost_parts(p, shape)
    ledgers = []
    for s in p.growth_stages():
        st = p.settings(s)
        down, up = paper_costs.growth_round_params(p.plan(s), parts, s or 1, p.vit.depth)
        taken = math.floor(st.client_fraction * st.rounds + 0.5)
        ledgers.append(
            [
                {
                    "rounds": taken,
                    "bytes_up": 4 * up * taken,
                    "bytes_down": 4 * down * taken,
                    "up_by_kind": {"blocks": 4 * up * taken},
                    "down_by_kind": {"blocks": 4 * down * taken},
                }
            ]
        )
    return costs.summarize_client_costs(
        _client_rows(p, shape, [n], ledgers), ("paper_flops", "encoder_bytes")
    )
