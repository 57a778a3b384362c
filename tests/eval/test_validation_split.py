"""The probes' validation split (``features.validation_size``): drawn from training images that
neither the probes' bank nor the partition holds, class-stratified with its own seed, scored by
the same fitted probes; the test metrics do not move with it, and without it nothing changes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from fedssl.data.partition import stratified_subset, unused_subset
from fedssl.evaluations.features import validation_indices
from fedssl.stage.runtime import StageFailed
from tests.fixtures import in_project, run_stage, tiny_chain_project

PROBES = """\
title: Raw pixels
partition: tiny_val
method: {{name: none, model: {{arch: pixels}}, seed: 0}}
features: {{layer: backbone, train_size: 60, batch_size: 256{val}}}
linear_probe: {{epochs: 5, lr: 0.01, weight_decay: 0.0, batch_size: 64, standardize: true, seed: 0}}
knn: {{k: 5, temperature: 0.1}}
"""
PARTITION = (
    "dataset: tiny\nnum_clients: 3\nscheme: {kind: iid}\nsubset: 100\n"
    "server_holdout: 20\nserver_holdout_seed: 7\nseed: 0\n"
)


def fake_ctx(size: int, clients, server=None, seed: int = 0):
    """What :func:`validation_indices` reads of a stage context."""
    return SimpleNamespace(
        exp=SimpleNamespace(
            features=SimpleNamespace(validation_size=size),
            method=SimpleNamespace(seed=seed),
            partition="p",
        ),
        partition=SimpleNamespace(server_holdout=None if server is None else len(server)),
        clients=lambda: clients,
        server_indices=lambda: server,
    )


def test_validation_avoids_bank_clients_and_server_and_keeps_the_class_mix():
    labels = np.arange(400) % 4
    clients = [np.arange(0, 60), np.arange(60, 140)]  # every set holds each class equally
    server, bank = np.arange(140, 160), np.arange(160, 260)
    val = validation_indices(fake_ctx(80, clients, server), labels, bank)
    assert len(val) == 80 and len(np.unique(val)) == 80
    for held in (bank, *clients, server):
        assert not np.intersect1d(val, held).size
    assert np.bincount(labels[val]).tolist() == [20] * 4  # stratified (the pool is balanced)
    again = validation_indices(fake_ctx(80, clients, server), labels, bank)
    assert np.array_equal(val, again)  # deterministic
    # its own seed: not the bank's draw of the same pool
    free = np.setdiff1d(np.arange(400), np.concatenate([bank, *clients, server]))
    assert not np.array_equal(val, free[stratified_subset(labels[free], 80, 0)])
    other = validation_indices(fake_ctx(80, clients, server, seed=1), labels, bank)
    assert not np.array_equal(val, other)


def test_too_few_unused_images_fail_naming_the_field():
    labels = np.arange(100) % 4
    with pytest.raises(StageFailed, match=r"features.validation_size: 41 images .* only 40"):
        validation_indices(fake_ctx(41, [np.arange(60)]), labels, np.arange(10))
    with pytest.raises(ValueError, match="only 0 are held by nobody"):
        unused_subset(labels, [np.arange(100)], 1, 0)


def test_validation_needs_a_bank_smaller_than_the_training_split():
    from fedssl.params import FeatureParams

    with pytest.raises(ValueError, match="validation_size needs train_size"):
        FeatureParams(validation_size=10)


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """Two runs of the raw-pixel probes on one partition, without and with a validation split:
    (features.npz arrays, results folder) of each."""
    root = tmp_path_factory.mktemp("val")
    experiments = {
        "px_plain": PROBES.format(val=""),
        "px_val": PROBES.format(val=", validation_size: 40"),
    }
    tiny_chain_project(root, experiments, "val", list(experiments))
    (root / "params/partitions/tiny_val.yaml").write_text(PARTITION)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDSSL_DEVICE", "cpu")
        with in_project(root) as planned:
            for name in experiments:
                stage = planned("evaluate", name)
                run_stage(stage, upstream=True)
                features = planned("features", name).spec.out
                with np.load(root / features / "features.npz") as z:
                    out[name] = ({k: z[k] for k in z.files}, root / "results/experiments" / name)
    return root, out


def test_the_same_probes_score_the_validation_split_and_the_test_metrics_do_not_move(probed):
    _, out = probed
    (plain, plain_dir), (val, val_dir) = out["px_plain"], out["px_val"]
    assert sorted(plain) == ["test_x", "test_y", "train_x", "train_y"]
    for key in plain:
        assert np.array_equal(plain[key], val[key])
    assert len(val["val_y"]) == 40 and set(val["val_y"]) == {0, 1, 2, 3}
    # raw pixels: a validation row is a training image; none is in the bank
    bank = {row.tobytes() for row in val["train_x"]}
    assert not any(row.tobytes() in bank for row in val["val_x"])
    a = json.loads((plain_dir / "metrics.json").read_text())
    b = json.loads((val_dir / "metrics.json").read_text())
    assert {k: v for k, v in b.items() if not k.endswith("_val")} == a
    assert set(b) - set(a) == {"linear_top1_val", "knn_top1_val"}
    for name in ("predictions.npz", "linear_epochs.tsv"):
        assert (plain_dir / name).read_bytes() == (val_dir / name).read_bytes()


def test_validation_images_are_none_of_the_partitions(probed):
    root, out = probed
    import torch
    from torch import nn

    from fedssl.data import load_clients, load_split
    from fedssl.eval.probes import extract_features

    images, _ = load_split(root / "artifacts/data/tiny", "train")
    part = root / "artifacts/partitions/tiny_val"
    held = np.concatenate([*load_clients(part), np.load(part / "server.npy")])
    rows = extract_features(nn.Flatten(), images[held], 256, torch.device("cpu"))
    taken = {row.tobytes() for row in rows}
    assert not any(row.tobytes() in taken for row in out["px_val"][0]["val_x"])


def test_only_a_validating_features_stage_reads_the_partition_and_a_sure_misfit_is_refused(probed):
    from fedssl.plan.dag import Dag
    from fedssl.stage.record import ParamsError

    root, _ = probed
    with in_project(root) as planned:
        assert "partition__tiny_val" not in planned("features", "px_plain").spec.upstream
        assert "partition__tiny_val" in planned("features", "px_val").spec.upstream
        # 240 images: 100 dealt to clients, 20 to the server: at most 120 are free
        big = root / "params/experiments/px_big.yaml"
        big.write_text(PROBES.format(val=", validation_size: 121"))
        try:
            with pytest.raises(ParamsError, match=r"features.validation_size: 121 .* at most 120"):
                Dag.for_stage("features", "px_big")
        finally:
            big.unlink()
