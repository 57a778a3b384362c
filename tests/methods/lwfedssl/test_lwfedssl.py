"""LW-FedSSL, Prog-FedSSL, FedMoCo and FedMoCo-LW (spec methods/lw-fedssl.md): what each
trains and exchanges per stage (Tab. 2), the MoCo v3 learner with its shared frozen prefix, the
momentum branch, calibration, growth with weight transfer, the per-stage DAG, and the whole
chain on a tiny project."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
import yaml

from fedssl import params as P
from fedssl.experiment import experiment_model
from fedssl.fl.cohort import LocalData
from fedssl.losses import moco_v3_loss
from fedssl.methods import registry
from fedssl.methods.lwfedssl import costs as lw_costs
from fedssl.methods.lwfedssl import run
from fedssl.models.heads import moco_v3_predictor, moco_v3_projector
from fedssl.models.mocov3 import MocoV3Learner, round_start_state
from fedssl.models.vit import VisionTransformer
from tests.fixtures import federation_changed, make_tiny_project, toy_images
from tests.lwfedssl_fixtures import add_tiny_lw, tiny_text

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_exp(method: str, extra: str = ""):
    return experiment_model().model_validate(yaml.safe_load(tiny_text(method, extra)))


def toy_data():
    images, labels = toy_images(120, 0)
    x, y = torch.from_numpy(images[:, None]), torch.from_numpy(labels)
    ids = np.arange(120)
    return (LocalData(x, y, [ids[:40], ids[40:70], ids[70:100]]), LocalData(x, y, [ids[100:]]))


def stage_model(p, s):
    """Stage s's starting model, grown from stage 1's seeded one (untrained in between)."""
    model = run.initial_online(p, (1, 28, 28), 1)
    for t in range(2, s + 1):
        model = run.grown(p, model, t)
    return model


def run_stage(p, s, tmp_path):
    """Stage s of ``p`` from its untrained starting model; returns (that model's online state,
    the final federation state, the federation)."""
    data, server = toy_data()
    model = stage_model(p, s) if s else run.initial_online(p, (1, 28, 28), p.vit.depth)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt = tmp_path / f"run{len(list(tmp_path.iterdir()))}.pt"
    fed, learner = run.make_federation(p, model, s, data, ckpt, "fp", server)
    state = fed.run(fed.start(learner))
    return start, state, fed


def changed(a, b, prefix) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a if k.startswith(prefix))


# ---------------------------------------------------------------------------- Tab. 2
@pytest.mark.parametrize(
    "method, trains_block0, down_blocks, up_blocks",
    [("fedmoco_lw", False, 1, 1), ("lw_fedssl", False, 3, 1), ("prog_fedssl", True, 3, 3)],
)
def test_stage_3_trains_and_exchanges_what_tab2_says(
    tmp_path, method, trains_block0, down_blocks, up_blocks
):
    p = tiny_exp(method).method
    start, state, fed = run_stage(p, 3, tmp_path)
    end = state.server["global"]
    block = 2_224  # parameters of one width-16 block (MLP 32)
    assert sum(q.numel() for q in fed.trainer.cohort.model.encoder.blocks[0].parameters()) == block
    per_client = state.ledger.summary()["per_client"]
    for c in per_client:
        assert c["down_by_kind"]["blocks"] == down_blocks * block * 4 * 1  # one round
        assert c["up_by_kind"]["blocks"] == up_blocks * block * 4
    assert changed(start, end, "encoder.blocks.2.")  # the newest block always trains
    # the first block: trained by Prog-FedSSL's clients or LW-FedSSL's calibration only
    assert changed(start, end, "encoder.blocks.0.") == (trains_block0 or method == "lw_fedssl")
    assert changed(start, end, "encoder.patch_embed.") == (trains_block0 or method == "lw_fedssl")
    assert set(fed.strategy.train) >= {
        "projector.0.weight",
        "predictor.3.weight",
        "encoder.norm.weight",
    }


def test_fedmoco_trains_and_sends_every_block_every_round(tmp_path):
    p = tiny_exp("fedmoco").method
    start, state, fed = run_stage(p, None, tmp_path)
    assert len(state.log) == 3  # S x R_s rounds end to end
    for prefix in ("encoder.blocks.0.", "encoder.blocks.2.", "encoder.patch_embed."):
        assert changed(start, state.server["global"], prefix)
    c = state.ledger.summary()["per_client"][0]
    assert c["down_by_kind"] == c["up_by_kind"]
    assert c["down_by_kind"]["blocks"] == 3 * 3 * 2_224 * 4


def test_fedmoco_lw_catches_up_on_what_froze_and_weight_transfer_carries_the_block(tmp_path):
    """A FedMoCo-LW client never downloads the final aggregate of a block that just froze:
    with weight transfer the new block arrives as its copy. The embedding's last aggregate
    comes once, in stage 2's first round; without weight transfer so does the frozen block."""
    p = tiny_exp("fedmoco_lw").method
    model = stage_model(p, 2)
    vit = model["encoder"]
    for a, b in zip(vit.blocks[0].state_dict().values(), vit.blocks[1].state_dict().values()):
        assert torch.equal(a, b)
    _, state, fed = run_stage(p, 2, tmp_path)
    c = state.ledger.summary()["per_client"][0]
    assert c["down_by_kind"]["embedding"] == 4 * (16 * 49 + 16 + 16)  # conv, bias, CLS: once
    assert "embedding" not in c["up_by_kind"] and c["down_by_kind"]["blocks"] == 2_224 * 4
    no_wt = tiny_exp("fedmoco_lw", "  stages: {}\n").method.model_copy(
        update={"weight_transfer": False}
    )
    fresh = stage_model(no_wt, 2)["encoder"]
    assert not torch.equal(fresh.blocks[0].mlp[0].weight, fresh.blocks[1].mlp[0].weight)
    _, state, _ = run_stage(no_wt, 2, tmp_path)
    c = state.ledger.summary()["per_client"][0]
    assert c["down_by_kind"]["blocks"] == 2 * 2_224 * 4  # the frozen block, once


def test_lw_fedssl_calibrates_before_every_round_and_not_after_the_last(tmp_path):
    p = tiny_exp("lw_fedssl", "  stages: {s2: {rounds: 3}}\n").method
    _, state, fed = run_stage(p, 2, tmp_path)
    assert [("calibration_loss" in r) for r in state.log] == [True, True, False]
    end_timing = p.model_copy(
        update={"calibration": p.calibration.model_copy(update={"timing": "round_end"})}
    )
    _, state, _ = run_stage(end_timing, 2, tmp_path)
    assert all("calibration_loss" in r for r in state.log)
    off = p.model_copy(update={"calibration": p.calibration.model_copy(update={"enabled": False})})
    assert off.plan(2).downloads == "last"  # nothing else changes on the server


# ---------------------------------------------------------------------------- the learner
def learner(prefix: int, alpha: float = 0.0, depth: int = 3) -> MocoV3Learner:
    torch.manual_seed(0)
    vit = VisionTransformer(
        image_size=28, patch_size=7, in_channels=1, width=16, depth=depth, heads=2, mlp_ratio=2.0
    )
    return MocoV3Learner(
        vit, moco_v3_projector(16, 32, 16), moco_v3_predictor(16, 32, 16), 0.2, alpha, prefix
    )


def test_shared_frozen_prefix_gives_the_loss_of_three_separate_branches():
    x1, x2 = torch.rand(6, 1, 28, 28), torch.rand(6, 1, 28, 28)
    shared, separate = learner(2, alpha=0.5), learner(0, alpha=0.5)
    separate.load_state_dict(shared.state_dict())
    torch.testing.assert_close(shared(x1, x2), separate(x1, x2))
    # and by hand: the MoCo v3 loss plus alpha times the alignment term
    m = shared
    with torch.no_grad():
        z1, z2 = m.encoder(x1), m.encoder(x2)
        q1, q2 = m.predictor(m.projector(z1)), m.predictor(m.projector(z2))
        k1, k2 = m.target_projector(m.target_encoder(x1)), m.target_projector(m.target_encoder(x2))
        g1, g2 = m.global_encoder(x1), m.global_encoder(x2)
        expected = moco_v3_loss(q1, q2, k1, k2, 0.2) + 0.5 * moco_v3_loss(z1, z2, g1, g2, 0.2)
        torch.testing.assert_close(m(x1, x2), expected)


def test_the_frozen_prefix_runs_once_for_all_branches_and_keeps_no_activations():
    """Online, momentum and global encoders share the frozen prefix's output: its forward runs
    once instead of three times (the paper's FLOP count runs it in every branch), and no
    activation of it is kept for the backward pass."""
    from fedssl import costs

    x = torch.rand(8, 1, 28, 28)
    flops, saved = {}, {}
    for prefix in (0, 2):
        m = learner(prefix, alpha=0.5)
        for name, q in m.named_parameters():
            q.requires_grad_(
                name.startswith(("encoder.blocks.2.", "encoder.norm.", "projector.", "predictor."))
            )
        flops[prefix] = costs.forward_flops(lw_costs._TwoViews(m), x)
        saved[prefix] = costs.saved_activation_bytes(lw_costs._TwoViews(m), x, lambda out, _x: out)
    with torch.no_grad():
        embed_and_two = costs.forward_flops(
            lambda v: m.encoder.blocks[1](m.encoder.blocks[0](m.encoder.embed(v))), x
        )
    assert flops[0] - flops[2] == 2 * embed_and_two
    assert saved[2] == saved[0]  # autograd keeps nothing of frozen layers either way
    everything = learner(0)
    all_saved = costs.saved_activation_bytes(lw_costs._TwoViews(everything), x, lambda o, _x: o)
    assert saved[2] < 0.6 * all_saved


def test_momentum_branch_moves_by_ema_and_frozen_twins_stay_equal(tmp_path):
    p = tiny_exp("fedmoco_lw").method
    data, _ = toy_data()
    model = stage_model(p, 2)
    fed, lrn = run.make_federation(p, model, 2, data, tmp_path / "m.pt", "fp")
    start = round_start_state(
        {k: v for k, v in fed.strategy.init_server(lrn)["global"].items()}, False
    )
    trained, _ = fed.trainer.cohort.train(
        [start], data, [0], 1e-2, (0, "t"), torch.Generator().manual_seed(0), fed.strategy.train
    )
    row = {k: v[0] for k, v in trained.items()}
    for k in row:
        if k.startswith("target_encoder.blocks.0.") or k.startswith("target_encoder.patch"):
            assert torch.equal(row[k], row[k.removeprefix("target_")])  # frozen: equal
    k = "encoder.blocks.1.mlp.0.weight"
    moved, ema = row[k] - start[k], row["target_" + k] - start["target_" + k]
    assert moved.abs().sum() > 0 and ema.abs().sum() > 0
    assert ema.abs().sum() < 0.2 * moved.abs().sum()  # mu = 0.99: it trails far behind


def test_growth_copies_the_last_block_and_keeps_the_trained_ones():
    p = tiny_exp("lw_fedssl").method
    model = run.initial_online(p, (1, 28, 28), 1)
    with torch.no_grad():
        model["encoder"].blocks[0].mlp[0].weight.add_(1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grown = run.grown(p, model, 2)
    after = grown.state_dict()
    assert grown["encoder"].depth == 2
    assert all(torch.equal(before[k], after[k]) for k in before)
    torch.testing.assert_close(
        after["encoder.blocks.1.mlp.0.weight"], before["encoder.blocks.0.mlp.0.weight"]
    )


# ---------------------------------------------------------------------------- params and DAG
def test_stage_overrides_are_checked_and_resolved():
    p = tiny_exp("lw_fedssl", "  stages: {s2: {rounds: 4, lr: 0.01, alpha: 0.5}}\n").method
    assert p.stage(2).rounds == 4 and p.stage(2).lr == 0.01 and p.stage_alpha(2) == 0.5
    assert p.stage(1).rounds == 1 and p.stage_alpha(3) == 0.01
    assert p.stage_rounds() == [1, 4, 1]
    with pytest.raises(ValueError, match="'s4' is not a stage"):
        tiny_exp("prog_fedssl", "  stages: {s4: {rounds: 2}}\n")
    with pytest.raises(ValueError, match="method.prog_fedssl.stages.s2.alpha"):
        tiny_exp("prog_fedssl", "  stages: {s2: {alpha: 0.1}}\n")
    with pytest.raises(ValueError, match="not divisible"):
        tiny_exp("fedmoco", "  stages: {}\n".replace("stages: {}", "vit: {width: 20, heads: 3}"))


def test_steps_follow_the_schedule_and_read_only_their_own_stage():
    method = registry.get("lw_fedssl")
    p = tiny_exp("lw_fedssl", "  stages: {s2: {alpha: 0.5}, s3: {rounds: 2}}\n").method
    steps = method.steps_for(p)
    assert [s.name for s in steps] == ["grow_1", "grow_2", "grow_3"]
    assert steps[1].inputs[-1] == "grow_1" and "grow_1" not in steps[0].inputs
    assert "method.stages.s2" in steps[1].reads and "method.stages.s3" not in steps[1].reads
    # with the global cosine schedule, a stage's position depends on the others' rounds
    assert "method.stages.s3.rounds" in steps[1].reads
    assert "method.stages.s2.alpha" not in steps[2].reads
    constant = federation_changed(p, lr_schedule="constant")
    assert "method.stages.s3.rounds" not in method.steps_for(constant)[1].reads
    assert method.encoder_inputs_for(p) == ("grow_3",)
    assert method.costs_inputs_for(p) == ("grow_1", "grow_2", "grow_3")
    assert registry.get("fedmoco").steps_for(tiny_exp("fedmoco").method)[0].name == "pretrain"


def test_steps_for_defaults_to_the_class_attribute():
    from fedssl.methods.base import Method

    mfcl = registry.get("mfcl")
    assert Method.steps_for(mfcl, None) is mfcl.steps
    assert mfcl.encoder_inputs_for(None) == mfcl.encoder_inputs


def test_finetune_is_only_for_methods_that_can_train_their_encoder():
    raw = yaml.safe_load(tiny_text("fedmoco"))
    assert experiment_model().model_validate(raw).finetune.epochs == 2
    from tests.fixtures import tiny_experiment

    other = yaml.safe_load(tiny_experiment("x", "small_cnn", "none"))
    other["finetune"] = raw["finetune"]
    with pytest.raises(ValueError, match="no encoder to fine-tune"):
        experiment_model().model_validate(other)
    with pytest.raises(ValueError, match="warmup_epochs"):
        P.FinetuneParams(epochs=2, warmup_epochs=2)


# ---------------------------------------------------------------------------- the chain
def run_in_process(dag, only=None) -> list[str]:
    import importlib

    ran = []
    for stage in dag.stages.values():
        if only is None or stage.name in only:
            _, _, module, *args = stage.cmd.split()
            importlib.import_module(module).run(args)
            ran.append(stage.name)
    return ran


def test_the_family_runs_end_to_end_on_a_tiny_project(tmp_path, monkeypatch):
    from fedssl.plan.dag import Dag

    root = make_tiny_project(tmp_path, git=False)
    names = add_tiny_lw(root)
    watched = root / "params" / "experiments" / "tiny_lw_fedssl.yaml"  # with the k-NN monitor
    raw = yaml.safe_load(watched.read_text())
    raw["method"]["federation"]["monitor_every"] = 1
    watched.write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    dag = Dag("lw")
    kinds = [s.kind for s in dag.stages.values() if s.name.endswith("__tiny_lw_fedssl")]
    assert kinds == ["grow_1", "grow_2", "grow_3", "features", "evaluate", "finetune", "costs"]
    assert dag.stages["grow_2__tiny_lw_fedssl"].upstream[-1] == "grow_1__tiny_lw_fedssl"
    run_in_process(dag)
    with open(root / "results" / "reports" / "lw" / "report.csv") as f:
        rows = {r["experiment"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(names)
    for name, r in rows.items():
        assert 0 < float(r["linear_top1"]) <= 100 and 0 < float(r["finetune_top1"]) <= 100
        if name != "tiny_vit_scratch":
            assert r["rounds"] == "3" and float(r["peak_step_MB"]) > 0
    # the monitor reads the grown encoder after every stage's round, the untrained one first
    results = root / "results" / "experiments" / "tiny_lw_fedssl"
    for s in (1, 2, 3):
        (row,) = csv.DictReader(open(results / f"grow_{s}.tsv"), delimiter="\t")
        assert 0 <= float(row["knn_monitor"]) <= 100 and "knn_monitor_round0" in row
    art = root / "artifacts" / "experiments"
    # the bytes in the costs are the ledger's; encoder bytes exclude the heads
    for name in ("tiny_fedmoco_lw", "tiny_lw_fedssl", "tiny_prog_fedssl"):
        cost = json.loads((art / name / "costs" / "costs.json").read_text())["per_client"][0]
        ledgers = [
            json.loads((art / name / f"grow_{s}" / "communication.json").read_text())["per_client"][
                0
            ]
            for s in (1, 2, 3)
        ]
        assert cost["bytes_exchanged"] == sum(c["bytes_up"] + c["bytes_down"] for c in ledgers)
        heads = sum(c["up_by_kind"]["heads"] + c["down_by_kind"]["heads"] for c in ledgers)
        assert cost["encoder_bytes"] == cost["bytes_exchanged"] - heads
    # blocks exchanged over the 3 stages (one round each), in blocks of fp32 width-16 blocks:
    # FedMoCo 3 x 3 x 2 = 18, LW 6 down + 3 up, Prog 2 x 6, FedMoCo-LW 3 x 2
    unit = 2_224 * 4
    expect = {"tiny_fedmoco": 18, "tiny_lw_fedssl": 9, "tiny_prog_fedssl": 12, "tiny_fedmoco_lw": 6}
    for name, blocks in expect.items():
        cost = json.loads((art / name / "costs" / "costs.json").read_text())
        assert cost["mean_block_bytes"] == blocks * unit
    report = (root / "results" / "reports" / "lw" / "report.md").read_text()
    assert "LW-FedSSL Tab. 3 layout" in report
    tab3 = report.split("LW-FedSSL Tab. 3 layout")[1].split("\n## ")[0]
    lw = next(line for line in tab3.splitlines() if line.startswith("| LW-FedSSL |"))
    cells = [c.strip() for c in lw.split("|")[1:-1]]
    enc = {
        n: json.loads((art / n / "costs" / "costs.json").read_text())["mean_encoder_bytes"]
        for n in ("tiny_lw_fedssl", "tiny_fedmoco")
    }
    assert cells[5] == f"{enc['tiny_lw_fedssl'] / enc['tiny_fedmoco']:.3f}"  # Comm / FedMoCo
    meta = json.loads((art / "tiny_lw_fedssl" / "grow_3" / "meta.json").read_text())
    assert meta["blocks"] == 3 and meta["calibration"] and meta["server_samples"] == 30
