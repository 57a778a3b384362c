"""LW-FedSSL's cost accounting (App. A, §5.2): the paper's FLOP and communication formulas
reproduce Tab. 1 and Tab. 3 for ViT-Tiny, the spec's exact smoke ratios hold, the formula's
parts match the real model and FlopCounterMode, and the measured per-stage costs order the
methods as the paper does."""

from __future__ import annotations

import pytest
import torch
import yaml

from fedssl import costs
from fedssl.experiment import experiment_model
from fedssl.methods.lwfedssl import GrowthPlan, paper_costs
from fedssl.methods.lwfedssl import costs as lw_costs
from fedssl.models.heads import moco_v3_predictor, moco_v3_projector
from fedssl.models.vit import TransformerBlock, vit_tiny

PLANS = {
    "FedMoCo": GrowthPlan(False, "all", "all", "all"),
    "FedMoCo-LW": GrowthPlan(True, "last", "last", "last"),
    "LW-FedSSL": GrowthPlan(True, "last", "all", "last", global_forward=True),
    "Prog-FedSSL": GrowthPlan(True, "all", "all", "all"),
}
MIB = 2**20


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def schedule(parts, rounds=(15,) * 12):
    return {
        name: paper_costs.growth_schedule_costs(plan, parts, list(rounds))
        for name, plan in PLANS.items()
    }


def test_app_a_reproduces_tab1_and_tab3_for_vit_tiny():
    """ViT-Tiny on 32x32 with 64 tokens (the count that matches), heads 4096 -> 256,
    12 stages x 15 rounds. Tab. 1: FedMoCo 27.42e10 FLOPs and 7352 MB, FedMoCo-LW 9.58e10 and
    613 MB; Tab. 3 ratios: FLOPs 0.35 / 0.48 / 0.57, Comm 0.08 / 0.31 / 0.54; §5.2: LW-FedSSL
    downloads 1.8x and uploads 12x less than FedMoCo, 3.2x less in total."""
    c = schedule(paper_costs.vit_cost_parts())
    assert c["FedMoCo"]["flops"] / 1e10 == pytest.approx(27.43, abs=0.01)
    assert c["FedMoCo-LW"]["flops"] / 1e10 == pytest.approx(9.58, abs=0.01)
    ratio = {k: v["flops"] / c["FedMoCo"]["flops"] for k, v in c.items()}
    assert round(ratio["FedMoCo-LW"], 2) == 0.35
    assert round(ratio["LW-FedSSL"], 2) == 0.48
    assert round(ratio["Prog-FedSSL"], 2) == 0.57
    assert 1 / ratio["LW-FedSSL"] == pytest.approx(2.1, abs=0.05)  # "2.1x fewer FLOPs"
    assert 1 / ratio["Prog-FedSSL"] == pytest.approx(1.8, abs=0.05)
    # communication (encoder only, fp32, MiB)
    assert c["FedMoCo"]["bytes"] / MIB == pytest.approx(7352, rel=0.002)
    assert c["FedMoCo-LW"]["bytes"] / MIB == pytest.approx(613, rel=0.002)
    comm = {k: v["bytes"] / c["FedMoCo"]["bytes"] for k, v in c.items()}
    assert (
        round(comm["FedMoCo-LW"], 2),
        round(comm["LW-FedSSL"], 2),
        round(comm["Prog-FedSSL"], 2),
    ) == (0.08, 0.31, 0.54)
    assert 1 / comm["LW-FedSSL"] == pytest.approx(3.2, abs=0.05)
    lw, e2e = c["LW-FedSSL"], c["FedMoCo"]
    assert e2e["bytes_down"] / lw["bytes_down"] == pytest.approx(1.8, abs=0.05)
    assert e2e["bytes_up"] / lw["bytes_up"] == pytest.approx(12, abs=0.05)
    # with a CLS token (65 tokens) FedMoCo comes out at 27.85e10 (spec §5)
    with_cls = schedule(paper_costs.vit_cost_parts(cls_token=True))["FedMoCo"]["flops"]
    assert with_cls / 1e10 == pytest.approx(27.85, abs=0.01)


def test_spec_smoke_ratios_hold_exactly_for_s_6():
    """Counting blocks only (every other part 0): FLOPs per sample in block-forwards averaged
    over the stages, 9 < 12.5 < 14 < 24; communication over blocks 27/72, 1/6, 42/72."""
    blocks_only = paper_costs.VitCostParts(
        embed=0, block=1, norm=0, projector=0, predictor=0, embed_params=0, block_params=1
    )
    c = schedule(blocks_only, rounds=(1,) * 6)
    assert {k: v["flops"] / 6 for k, v in c.items()} == {
        "FedMoCo": 24,
        "FedMoCo-LW": 9,
        "LW-FedSSL": 12.5,
        "Prog-FedSSL": 14,
    }
    comm = {k: v["bytes"] / c["FedMoCo"]["bytes"] for k, v in c.items()}
    assert comm["LW-FedSSL"] == 27 / 72 == 0.375
    assert comm["FedMoCo-LW"] == pytest.approx(1 / 6)
    assert comm["Prog-FedSSL"] == 42 / 72 == pytest.approx(0.583, abs=1e-3)


def test_formula_parts_are_the_real_model_and_flop_counter_counts():
    parts = paper_costs.vit_cost_parts()
    block = TransformerBlock(192, 3, 4.0)
    assert parts.block_params == sum(q.numel() for q in block.parameters()) == 444_864
    with torch.device("meta"):
        model = vit_tiny(pool="mean")
    assert parts.embed_params == sum(q.numel() for q in model.patch_embed.parameters())
    # FlopCounterMode counts 2 per multiply-add and no LayerNorm (fvcore counts 5 per element)
    layer_norms = 2 * 5 * 64 * 192
    assert costs.forward_flops(block, torch.rand(1, 64, 192)) == 2 * (parts.block - layer_norms)
    heads = torch.nn.Sequential(moco_v3_projector(192), moco_v3_predictor()).eval()
    assert costs.forward_flops(heads, torch.rand(1, 192)) == 2 * (parts.projector + parts.predictor)


def test_attention_counts_on_the_cpu_too():
    """CPU attention goes through a kernel FlopCounterMode did not know; fedssl.costs
    registers it, forward (2 matmuls of T x T x d) and backward."""
    q = torch.rand(1, 2, 10, 8, requires_grad=True)
    from torch.utils.flop_counter import FlopCounterMode

    forward, both = FlopCounterMode(display=False), FlopCounterMode(display=False)
    with forward, torch.no_grad():
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    with both:
        torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()
    assert forward.get_total_flops() == 2 * (2 * 2 * 10 * 10 * 8)  # q k^T and (.) v
    assert both.get_total_flops() > 3 * forward.get_total_flops()


def smoke_method(name):
    """The smoke presets' method params (params/experiments/smoke_*.yaml)."""
    from fedssl.presets import Presets
    from tests.fixtures import REPO

    return Presets(REPO / "params").load("experiment", f"smoke_{name}").method


def test_measured_stage_costs_order_the_methods_like_the_paper():
    shape = (1, 28, 28)
    e2e = lw_costs.measure_stage(smoke_method("fedmoco"), shape, None)
    last = {
        name: lw_costs.measure_stage(smoke_method(name), shape, 6)
        for name in ("fedmoco_lw", "lw_fedssl", "prog_fedssl")
    }
    # Prog-FedSSL's last stage is FedMoCo's step; layer-wise steps need far less memory
    assert last["prog_fedssl"]["peak_bytes"] == e2e["peak_bytes"]
    assert last["prog_fedssl"]["flops_per_sample"] == e2e["flops_per_sample"]
    for name in ("fedmoco_lw", "lw_fedssl"):
        assert last[name]["peak_bytes"] < 0.5 * e2e["peak_bytes"]
    # the alignment's global encoder: a little more than FedMoCo-LW, kept without gradients
    assert (
        last["fedmoco_lw"]["peak_bytes"]
        < last["lw_fedssl"]["peak_bytes"]
        < 1.2 * last["fedmoco_lw"]["peak_bytes"]
    )
    assert last["fedmoco_lw"]["flops_per_sample"] < last["lw_fedssl"]["flops_per_sample"]
    # measured FLOPs are below App. A's count for layer-wise steps: the frozen prefix runs once
    # for the online, momentum and global branches (the paper counts it in each)
    paper = {k: v["paper_flops_per_round"] for k, v in last.items()}
    assert paper["fedmoco_lw"] < paper["lw_fedssl"] < paper["prog_fedssl"]


def test_projected_costs_follow_the_formulas():
    from fedssl.presets import Presets
    from tests.fixtures import REPO

    presets = Presets(REPO / "params")
    exp = presets.load("experiment", "smoke_fedmoco_lw")
    part = presets.load("partition", exp.partition)
    c = lw_costs.projected_costs(exp, part, "fashion_mnist")
    parts = lw_costs.cost_parts(exp.method, (1, 28, 28))
    formula = paper_costs.growth_schedule_costs(PLANS["FedMoCo-LW"], parts, [2] * 6)
    assert c["mean_encoder_bytes"] == formula["bytes"]
    assert c["mean_paper_flops"] == formula["flops"]
    assert yaml.safe_load((REPO / "params/experiments/paper_fedmoco.yaml").read_text())["method"][
        "federation"
    ]["lr"] == pytest.approx(1.5e-4 * 1024 / 256)
    assert experiment_model()  # the presets validate with every method registered
