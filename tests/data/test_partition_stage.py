"""The partition stage's extras for personalised and server-side methods: per-client test
splits with each client's class mix, the true groups of class_groups, a server holdout."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedssl.data import load_clients, load_split
from tests.fixtures import make_tiny_project, run


@pytest.fixture
def tiny(tmp_path):
    return make_tiny_project(tmp_path, git=False)


def partition(root, body: str) -> str:
    (root / "params/partitions/p.yaml").write_text(body)
    run(["python", "-m", "stages.prepare_data", "tiny"], root)
    run(["python", "-m", "stages.partition", "p"], root)
    return root / "artifacts/partitions/p"


def test_client_tests_mirror_each_clients_class_mix_and_groups_are_recorded(tiny):
    out = partition(
        tiny,
        "dataset: tiny\nnum_clients: 4\nseed: 0\nscheme: {kind: class_groups, "
        "groups: [[0, 1], [2, 3]], major_classes: 1, major_count: 8, "
        "minor_count: 2}\nclient_tests: {per_client: 10}\n",
    )
    counts = json.loads((out / "class_counts.json").read_text())
    assert counts["groups"] == [0, 0, 1, 1] and counts["test_sizes"] == [10] * 4
    _, test_labels = load_split(tiny / "artifacts/data/tiny", "test")
    for train, test in zip(counts["clients"], load_clients(out, "test_clients.npz")):
        held = np.bincount(test_labels[test], minlength=4)
        assert list(held) == train  # 8 + 2 training images -> 8 + 2 of 10 test images


def test_a_server_holdout_is_disjoint_from_every_client(tiny):
    out = partition(
        tiny, "dataset: tiny\nnum_clients: 3\nseed: 0\nscheme: {kind: iid}\nserver_holdout: 40\n"
    )
    server = np.load(out / "server.npy")
    clients = np.concatenate(load_clients(out))
    assert len(server) == 40 and not set(server) & set(clients)
    assert len(clients) == 240 - 40
    _, labels = load_split(tiny / "artifacts/data/tiny", "train")
    assert np.bincount(labels[server]).tolist() == [10, 10, 10, 10]  # class-stratified


def test_too_few_test_images_for_disjoint_client_tests_is_a_clear_error(tiny):
    (tiny / "params/partitions/p.yaml").write_text(
        "dataset: tiny\nnum_clients: 3\nseed: 0\nscheme: {kind: iid}\n"
        "client_tests: {per_client: 60, disjoint: true}\n"
    )
    run(["python", "-m", "stages.prepare_data", "tiny"], tiny)
    proc = run(["python", "-m", "stages.partition", "p"], tiny, check=False)
    assert proc.returncode == 2 and "client_tests" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_fixed_server_holdout_seed_keeps_one_server_slice_across_client_resamplings(tiny):
    """server_holdout_seed pins the server's slice while the partition seed resamples the
    clients (CP-CFL: one pretrained encoder for every trial); unset, it follows seed + 1."""
    from fedssl.data.partition import server_seed
    from fedssl.params import PartitionParams

    body = (
        "dataset: tiny\nnum_clients: 3\nscheme: {kind: iid}\nserver_holdout: 40\n"
        "server_holdout_seed: 7\nseed: "
    )
    first = partition(tiny, body + "0\n")
    server0, clients0 = np.load(first / "server.npy"), load_clients(first)
    second = partition(tiny, body + "1\n")
    assert np.array_equal(np.load(second / "server.npy"), server0)
    assert any(not np.array_equal(a, b) for a, b in zip(load_clients(second), clients0))
    part = PartitionParams(dataset="tiny", num_clients=3, scheme={"kind": "iid"}, seed=4)
    assert server_seed(part) == 5
    assert server_seed(part.model_copy(update={"server_holdout_seed": 7})) == 7
