"""MFCL wired as stages: phase 1 trains, secure aggregation equals FedAvg inside the engine,
export bytes and client dropout, rServer training, params validation, and the whole chain on a
tiny project."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from fedssl import params as P
from fedssl.data.augment import BatchAugment
from fedssl.experiment import experiment_model
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig
from fedssl.fl.state import FederationConfig
from fedssl.methods.mfcl import run as mfcl
from fedssl.models.autoencoder import ClientAutoencoder
from fedssl.models.encoders import BasicBlock
from fedssl.models.rserver import MfclEncoder, RServerModel, RServerModule
from fedssl.rounds.loop import Federation, LocalTraining
from fedssl.strategies.base import Strategy
from tests.fixtures import TINY_MFCL_EXPERIMENT, add_tiny_mfcl, make_tiny_project, run, toy_images


def tiny_exp(
    norm: str = "tn", secure: bool = False, client_module: dict | None = None, **phase1
) -> P.ExperimentParams:
    import yaml

    raw = yaml.safe_load(TINY_MFCL_EXPERIMENT.format(norm=norm, secure=str(secure).lower()))
    raw["method"]["phases"]["phase1"]["federation"].update(phase1)
    raw["method"]["client_module"].update(client_module or {})
    return experiment_model().model_validate(raw)


def toy_clients(n: int = 96):
    images, labels = toy_images(n, 0)
    x = torch.from_numpy(images[:, None])  # uint8 [n, 1, 28, 28]
    ids = np.arange(n)
    return x, [ids[:40], ids[40:70], ids[70:]], torch.from_numpy(labels)


def toy_data(n: int = 96) -> LocalData:
    images, clients, labels = toy_clients(n)
    return LocalData(images, labels, clients)


def test_phase1_autoencoder_loss_decreases(tmp_path):
    exp = tiny_exp(rounds=4, lr=0.01)
    model = mfcl.build_client_module(exp.method, (1, 28, 28), torch.device("cpu"))
    fed = mfcl.make_phase1_federation(exp.method, model, toy_data(), tmp_path / "ck.pt", "fp")
    state = fed.run(fed.start(model))
    losses = [r["loss"] for r in state.log]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.02, losses
    per_client = state.ledger.summary()["per_client"]
    ae_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert all(c["bytes_up"] == 4 * ae_bytes and c["rounds"] == 4 for c in per_client)


@pytest.mark.parametrize("norm", ["tn", "bn"])
def test_secure_aggregation_equals_fedavg_inside_the_engine(tmp_path, norm):
    augment = BatchAugment(tiny_exp().method.augment, 28)
    results = {}
    for secure in (False, True):
        torch.manual_seed(0)
        model = ClientAutoencoder("resnet18", 1, 4, norm, 2)
        cohort = CohortTrainer(
            model,
            mfcl.twin_batch(augment),
            mfcl.autoencoder_loss(),
            OptimizerConfig("adam"),
            batch_size=16,
            local_epochs=1,
            parallel=False,
        )
        cfg = FederationConfig(1, 1.0, 0.01)
        strategy = mfcl.SecureFedAvg(cfg) if secure else Strategy(cfg)
        fed = Federation(
            strategy, LocalTraining(cohort), toy_data(), cfg, tmp_path / f"{secure}.pt", "fp"
        )
        results[secure] = fed.run(fed.start(model)).server["global"]
    plain, masked = results[False], results[True]
    for k in plain:
        assert torch.allclose(plain[k].float(), masked[k].float(), atol=1e-6), k


def test_export_bytes_are_what_is_stored_and_dropout_drops_whole_clients():
    exp = tiny_exp()
    images, clients, _ = toy_clients()
    model = mfcl.build_client_module(exp.method, (1, 28, 28), torch.device("cpu"))
    augment = BatchAugment(exp.method.augment, 28)
    reps = mfcl.export_client(
        model, images, clients[0], augment, pairs=2, batch=16, seed=0, client=0
    )
    assert reps.dtype == torch.float16 and reps.shape == (40, 2, 2, 4, 14, 14)
    assert reps.numel() * reps.element_size() == 40 * 2 * 2 * 4 * 14 * 14 * 2
    again = mfcl.export_client(model, images, clients[0], augment, 2, 16, 0, 0)
    assert torch.equal(reps, again)  # seeded per (client, pair, chunk): reproducible
    assert not torch.equal(reps[:, 0], reps[:, 1])  # fresh views for every pair
    assert mfcl.dropped_clients(10, 0.0, 0) == []
    dropped = mfcl.dropped_clients(10, 0.3, 0)
    assert len(dropped) == 3 and dropped == mfcl.dropped_clients(10, 0.3, 0)
    assert len(mfcl.dropped_clients(3, 0.99, 0)) == 2  # someone always sends


def test_rserver_trains_on_exported_pairs():
    exp = tiny_exp()
    gen = torch.Generator().manual_seed(0)
    base = torch.rand(64, 1, 1, 4, 7, 7, generator=gen)
    reps = (base + 0.05 * torch.randn(64, 2, 2, 4, 7, 7, generator=gen)).half()
    model = RServerModel("resnet18", 4, 4, 16, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    p = exp.method.rserver.model_copy(update={"epochs": 6, "batch_pairs": 16})
    log = mfcl.train_rserver(model, reps, p)
    assert len(log) == 6 and all(np.isfinite(r["loss"]) for r in log)
    assert log[-1]["loss"] < log[0]["loss"], [r["loss"] for r in log]
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_mfcl_encoder_pairs_each_image_with_itself():
    torch.manual_seed(0)
    client = ClientAutoencoder("resnet18", 1, 4, "tn", 2).eval()
    enc = MfclEncoder(client, RServerModel("resnet18", 4, 4, 16, 8).eval(), projection=False)
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        alone = torch.cat([enc(x[i : i + 1]) for i in range(3)])
        together = enc(x)
    assert torch.allclose(alone, together, atol=1e-5)  # no cross-image statistics


# Width 64 (ResNet-18): (BasicBlocks kept, parameters) of the rServer module behind each cut;
# 11,166,976 = layers 1-4 in full. From cut 6 the client's 128 channels feed the next block.
RSERVER_CUTS = {
    1: (8, 11_166_976),
    2: (8, 11_166_976),
    3: (7, 11_092_992),
    4: (7, 11_092_992),
    5: (6, 11_019_008),
    6: (6, 11_100_928),
    7: (5, 10_788_864),
}


@pytest.mark.parametrize("cut", sorted(RSERVER_CUTS))
def test_rserver_module_drops_the_blocks_the_cut_covers(cut):
    p = tiny_exp(client_module={"width": 64, "channels_per_group": 16, "cut": cut}).method
    p = p.model_copy(update={"rserver": p.rserver.model_copy(update={"width": 64})})
    cpu = torch.device("cpu")
    client = mfcl.build_client_module(p, (3, 32, 32), cpu)
    backbone = mfcl.build_rserver(p, client.rep_channels, cpu).backbone.eval()
    blocks = [m for m in backbone if isinstance(m, BasicBlock)]
    kept, params = RSERVER_CUTS[cut]
    assert len(blocks) == kept and sum(p.numel() for p in backbone.parameters()) == params
    # The remaining blocks keep their own strides: ResNet-18's stride-2 blocks are 3, 5, 7.
    strides = [b.body[0].stride[0] for b in blocks]
    assert strides == [2 if i in (2, 4, 6) else 1 for i in range(8 - kept, 8)]
    with torch.no_grad():
        z = client.encode(torch.rand(2, 3, 32, 32))
        assert backbone(z).shape == (2, 512)
    assert mfcl.pre_pool_numel(client, (3, 32, 32)) == z[0].numel() * 4  # before the 2×2 pool


def test_rserver_skip_blocks_is_checked():
    with pytest.raises(ValueError, match="resnet18 only"):
        RServerModule("resnet50", 128, 8, skip_blocks=1)
    with pytest.raises(ValueError, match="skip_blocks must be in"):
        RServerModule("resnet18", 64, 8, skip_blocks=8)


def test_deep_cut_exports_and_deploys():
    """Cut 7 holds the stride-2 conv: the export is a quarter of the input's side, pre_pool_numel
    follows the encoder's real output, and the frozen encoder chains to the rServer."""
    p = tiny_exp(client_module={"cut": 7}).method
    images, clients, _ = toy_clients()
    cpu = torch.device("cpu")
    model = mfcl.build_client_module(p, (1, 28, 28), cpu)
    reps = mfcl.export_client(
        model, images, clients[0], BatchAugment(p.augment, 28), pairs=1, batch=16, seed=0, client=0
    )
    assert reps.shape == (40, 1, 2, 8, 7, 7)
    assert mfcl.pre_pool_numel(model, (1, 28, 28)) == 8 * 14 * 14
    rserver = mfcl.build_rserver(p, reps.shape[3], cpu)
    enc = mfcl.frozen_encoder(p, model.state_dict(), rserver.state_dict(), (1, 28, 28), cpu)
    assert enc(torch.rand(3, 1, 28, 28)).shape == (3, rserver.backbone.out_dim)


def test_tn_eval_pair_self_is_groupnorm_and_hflip_pairs_with_the_flip():
    torch.manual_seed(0)
    tn = ClientAutoencoder("resnet18", 1, 4, "tn", 2)
    gn = ClientAutoencoder("resnet18", 1, 4, "gn", 2)
    gn.load_state_dict(tn.state_dict())  # same keys: TN and GN both hold a weight and a bias
    rserver = RServerModel("resnet18", 4, 4, 16, 8).eval()
    encoders = {
        name: MfclEncoder(client, rserver, projection=False, tn_eval_pair=pair).eval()
        for name, client, pair in [("gn", gn, "self"), ("self", tn, "self"), ("hflip", tn, "hflip")]
    }
    x = torch.rand(3, 1, 28, 28)
    symmetric = (x + x.flip(-1)) / 2
    with torch.no_grad():
        out = {name: enc(x) for name, enc in encoders.items()}
        sym = {name: enc(symmetric) for name, enc in encoders.items()}
    assert torch.allclose(out["self"], out["gn"], atol=1e-5)  # TN on (x, x) = GroupNorm
    assert not torch.allclose(out["hflip"], out["self"], atol=1e-3)
    assert torch.equal(sym["hflip"], sym["self"])  # x.flip(-1) == x: the same twin
    assert tiny_exp().method.client_module.tn_eval_pair == "self"
    p = tiny_exp(client_module={"tn_eval_pair": "hflip"}).method
    enc = mfcl.frozen_encoder(
        p, tn.state_dict(), rserver.state_dict(), (1, 28, 28), torch.device("cpu")
    )
    assert enc.tn_eval_pair == "hflip"
    with pytest.raises(ValueError, match="tn_eval_pair"):
        MfclEncoder(tn, rserver, projection=False, tn_eval_pair="other")


def test_mfcl_params_are_checked():
    raw = tiny_exp().model_dump()
    raw["method"]["name"] = "fedsimclr"
    with pytest.raises(ValueError, match="method.fedsimclr"):  # MFCL's fields refused
        experiment_model().model_validate(raw)
    raw = tiny_exp().model_dump()
    raw["method"]["rserver"]["warmup_epochs"] = 99
    with pytest.raises(ValueError, match="warmup_epochs"):
        experiment_model().model_validate(raw)
    assert tiny_exp().method.client_module.cut == 2
    with pytest.raises(ValueError, match="cut"):
        tiny_exp(client_module={"cut": 8})
    with pytest.raises(ValueError, match="cut applies to arch resnet18 only"):
        tiny_exp(client_module={"arch": "resnet50", "cut": 3})
    assert tiny_exp(client_module={"arch": "resnet50"}).method.client_module.cut == 2
    with pytest.raises(ValueError, match="tn_eval_pair"):
        tiny_exp(client_module={"tn_eval_pair": "vflip"})


def run_in_process(dag) -> None:
    """Run every stage of a DAG, upstream first, in this process (the same `run(argv)` the
    front ends call through `python -m`, without a torch import per stage)."""
    import importlib

    for stage in dag.stages.values():
        _, _, module, *args = stage.cmd.split()
        importlib.import_module(module).run(args)


def test_mfcl_chain_runs_end_to_end_on_a_tiny_project(tmp_path, monkeypatch):
    from fedssl.plan.dag import Dag

    root = make_tiny_project(tmp_path, git=False)
    names = add_tiny_mfcl(root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    dag = Dag("mfcl")
    assert [s.kind for s in dag.stages.values() if s.name.endswith("tiny_mfcl_tn")] == [
        "pretrain",
        "export",
        "rserver",
        "features",
        "evaluate",
        "costs",
    ]
    run_in_process(dag)
    with open(root / "results" / "reports" / "mfcl" / "report.csv") as f:
        rows = {r["experiment"]: r for r in csv.DictReader(f)}
    assert set(rows) == {*names, "tiny_simclr"}
    for r in rows.values():
        assert float(r["linear_top1"]) > 0 and float(r["client_GFLOPs"]) > 0
        assert float(r["paper_bits"]) > 0 and float(r["paper_memory_MB"]) > 0
    assert rows["tiny_mfcl_tn"]["arch"] == "resnet18-tn"
    exp_dir = root / "artifacts" / "experiments" / "tiny_mfcl_tn"
    manifest = json.loads((exp_dir / "export" / "manifest.json").read_text())
    assert len(manifest["dropped_clients"]) == 1  # round(0.34 * 3)
    for c in manifest["per_client"]:
        path = exp_dir / "export" / f"client_{c['client']}.npy"
        if c["dropped"]:
            assert c["bytes_sent"] == 0 and not path.exists()
        else:
            stored = np.load(path)
            assert c["bytes_sent"] == stored.nbytes == stored.size * 2
    costs = json.loads((exp_dir / "costs" / "costs.json").read_text())
    dropped = [c for c in costs["per_client"] if c["dropped"]]
    assert len(dropped) == 1 and dropped[0]["bits_p2"] == 0
    meta = json.loads((exp_dir / "pretrain" / "meta.json").read_text())
    assert meta["secure_aggregation"] and meta["rounds"] == 2
    losses = [
        float(r["loss"])
        for r in csv.DictReader(
            open(root / "results" / "experiments" / "tiny_mfcl_tn" / "rounds.tsv"), delimiter="\t"
        )
    ]
    assert losses[-1] < losses[0]
    # Snakemake plans the same chain from the same DAG and sees it all done
    out = run(["snakemake", "-n", "--cores", "1", "--config", "pipeline=mfcl"], root).stdout
    assert "Nothing to be done" in out


def test_self_paired_twin_norm_export_shares_no_statistics_within_a_pair():
    """tn_pairing='self' normalises each view alone: the export of a TN client module then
    equals that of a GroupNorm module with the same weights; the paper's twin pairing does not."""
    images, clients, _ = toy_clients()
    cpu = torch.device("cpu")
    tn = mfcl.build_client_module(tiny_exp().method, (1, 28, 28), cpu)
    gn = mfcl.build_client_module(tiny_exp("gn").method, (1, 28, 28), cpu)
    with torch.no_grad():  # non-trivial affine weights, shared by both modules
        for p in tn.parameters():
            p.add_(0.1 * torch.randn_like(p))
    gn.load_state_dict(tn.state_dict())
    args = (images, clients[0], BatchAugment(tiny_exp().method.augment, 28), 1, 16, 0, 0)
    alone = mfcl.export_client(tn, *args, tn_pairing="self").float()
    assert torch.allclose(alone, mfcl.export_client(gn, *args).float(), atol=2e-3)
    twin = mfcl.export_client(tn, *args).float()
    assert (twin - alone).abs().max() > 0.05
