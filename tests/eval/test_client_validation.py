"""The clients' validation images (``client_tests.validation_per_client``): training images that
no client and no server slice holds, each client's with its training class mix (as its test
images), drawn with their own seed; the personal evaluation scores the final models on them
(``personal_top1_val``) and nothing of the test side moves; without them nothing changes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedssl.data import load_clients, load_split
from fedssl.data.client_tests import matching_test_split, proportional_counts
from fedssl.stage.record import ParamsError
from fedssl.stage.runtime import derive_seed
from tests.fixtures import make_tiny_project, run

PARTITION = """\
dataset: tiny
num_clients: 3
seed: 0
scheme: {{kind: shards, classes_per_client: 2}}
subset: 120
server_holdout: 24
client_tests: {{per_client: 12{val}}}
"""
VAL = ", validation_per_client: 8"

EXPERIMENT = """\
title: FedRep
partition: {partition}
method:
  name: mpfedcon
  variant: fedrep
  net: {{base: cnn, conv_channels: [4, 8], kernel_size: 5, hidden: [16], projection: [16, 8]}}
  federation: {{rounds: 2, client_fraction: 1.0, batch_size: 16, lr: 0.1}}
  head_epochs: 1
  body_epochs: 1
  augment: crop_flip
  seed: 0
personal: {{last_rounds: 2, checkpoints: [0.5, 1.0]}}
"""

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = make_tiny_project(tmp_path_factory.mktemp("clientval"), git=False)
    for name, val in (("plain", ""), ("val", VAL)):
        (root / f"params/partitions/{name}.yaml").write_text(PARTITION.format(val=val))
    run(["python", "-m", "stages.prepare_data", "tiny"], root)
    for name in ("plain", "val"):
        run(["python", "-m", "stages.partition", name], root)
    return root


def files(folder) -> dict[str, bytes]:
    """A partition's outputs but its record and its heat map (whose title names it)."""
    skip = ("meta.json", "heatmap.png")
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name not in skip}


def test_validation_images_are_nobodys_and_follow_each_clients_class_mix(tiny):
    out = tiny / "artifacts/partitions/val"
    _, labels = load_split(tiny / "artifacts/data/tiny", "train")
    clients, server = load_clients(out), np.load(out / "server.npy")
    val = load_clients(out, "val_clients.npz")
    counts = json.loads((out / "class_counts.json").read_text())["clients"]
    held = np.concatenate([*clients, server])
    for mine, train in zip(val, counts):
        assert len(mine) == 8 == len(np.unique(mine))
        assert not np.intersect1d(mine, held).size  # no client's, not the server's
        assert list(np.bincount(labels[mine], minlength=4)) == list(proportional_counts(train, 8))
    # drawn like the test images, from the free images, with a seed of its own
    free = np.setdiff1d(np.arange(len(labels)), held)
    seed = derive_seed(0, "client-validation")
    again = [free[v] for v in matching_test_split(counts, labels[free], 8, seed)]
    assert all(np.array_equal(a, b) for a, b in zip(val, again))  # deterministic
    same_seed = [free[v] for v in matching_test_split(counts, labels[free], 8, 0)]
    assert not all(np.array_equal(a, b) for a, b in zip(val, same_seed))


def test_the_rest_of_the_partition_is_byte_identical_with_validation_on_or_off(tiny):
    plain = files(tiny / "artifacts/partitions/plain")
    val = files(tiny / "artifacts/partitions/val")
    assert set(val) - set(plain) == {"val_clients.npz"}
    counts = json.loads(val.pop("class_counts.json"))
    assert counts.pop("val_sizes") == [8, 8, 8]
    assert counts == json.loads(plain.pop("class_counts.json"))
    assert all(val[name] == content for name, content in plain.items())


def test_a_request_beyond_the_unused_images_fails_naming_the_field(tiny):
    import yaml

    from fedssl.params import PartitionParams
    from fedssl.presets import check_client_validation_fits

    # 240 images, 120 dealt, 24 to the server: 96 are free
    text = PARTITION.format(val=", validation_per_client: 97")
    with pytest.raises(ParamsError, match=r"validation_per_client: 97 .* at most 96"):
        check_client_validation_fits(PartitionParams(**yaml.safe_load(text)), "big.yaml", 240)
    fits = PARTITION.format(val=", validation_per_client: 96")
    check_client_validation_fits(PartitionParams(**yaml.safe_load(fits)), "big.yaml", 240)
    (tiny / "params/partitions/big.yaml").write_text(text)
    proc = run(["python", "-m", "stages.partition", "big"], tiny, check=False)
    assert proc.returncode != 0
    assert "client_tests.validation_per_client" in proc.stdout + proc.stderr


GROUPS = """\
dataset: tiny
num_clients: 4
seed: 0
scheme: {{kind: class_groups, groups: [[0, 1, 2], [1, 2, 3]], major_classes: 1, major_count: 8,
         minor_count: 2}}
client_tests: {{per_client: null{val}}}
server_holdout: 80
"""


def cpcfl_experiment(partition: str) -> str:
    from tests.methods.cpcfl.test_cpcfl import tiny_yaml

    text = tiny_yaml("FedAvg (None)", "none", 1, 0, "null")
    return text.replace("partition: tiny_groups", f"partition: {partition}")


# method: (its partition, its experiment on a partition, clients); each scored on 8 images
CASES = {
    "mpfedcon": (PARTITION, lambda part: EXPERIMENT.format(partition=part), 3),
    "cpcfl": (GROUPS, cpcfl_experiment, 4),
}


@pytest.mark.parametrize("method", list(CASES))
def test_the_final_models_score_their_validation_images_and_the_test_side_does_not_move(
    tiny, monkeypatch, method
):
    from tests.fixtures import in_project, run_stage

    partition, experiment, clients = CASES[method]
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    for name, val in (("plain", ""), ("val", VAL)):
        (tiny / f"params/partitions/{method}_{name}.yaml").write_text(partition.format(val=val))
        text = experiment(f"{method}_{name}")
        (tiny / f"params/experiments/{method}_{name}.yaml").write_text(text)
    with in_project(tiny) as planned:
        for name in ("plain", "val"):
            stage = planned("personal", f"{method}_{name}")
            run_stage(stage, upstream=True)
            step = [u for u in stage.spec.upstream if not u.startswith("partition__")]
    art = tiny / "artifacts/experiments"
    step = step[0].split("__")[0]
    with (
        np.load(art / f"{method}_plain/{step}/personal.npz") as a,
        np.load(art / f"{method}_val/{step}/personal.npz") as b,
    ):
        assert set(b.files) - set(a.files) == {"val_accuracy"}
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
        val = b["val_accuracy"]
    assert val.shape == (clients,) and all((v * 8 / 100).is_integer() for v in val)  # k of 8
    res = tiny / "results/experiments"
    plain = json.loads((res / f"{method}_plain/metrics.json").read_text())
    metrics = json.loads((res / f"{method}_val/metrics.json").read_text())
    assert metrics.pop("personal_top1_val") == round(float(val.mean()), 2)
    assert metrics == plain
