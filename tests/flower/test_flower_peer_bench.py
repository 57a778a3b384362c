"""benchmarks/flower_peer.py's Flower side runs on the current code: both of Flower's
simulation paths train the default pipeline's FedSimCLR round (its federation block's lr, batch
and epochs), in fp32 and under bf16 autocast, in the measured process tree the benchmark reads.
Opt-in (FEDSSL_FLOWER_TEST=1, with `.[flower]` installed): `make test-flower` and CI."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from tests.fixtures import REPO, opt_in

pytestmark = opt_in(
    "flower", "FEDSSL_FLOWER_TEST", "make test-flower (needs pip install -e '.[flower]')", 900
)


def peer():
    spec = importlib.util.spec_from_file_location("flower_peer", REPO / "benchmarks/flower_peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "side, precision",
    [("start_simulation", "fp32"), ("run_simulation", "bf16"), ("ours", "fp32")],
)
def test_each_side_measures_two_rounds_of_the_preset(side, precision, monkeypatch):
    monkeypatch.chdir(REPO)
    args = argparse.Namespace(
        images=64, rounds=2, precision=precision, compile="off", peer_precision=precision, cpu=None
    )
    run = peer().measure(side, 2, args)
    assert run["precision"] == precision
    assert len(run["stamps"]) == 3  # the start and both rounds' ends
    assert 0 < run["cpu_round"] < run["cpu_s"]
    assert run["peak_mb"] > 100  # the tree's torch process(es), sampled
