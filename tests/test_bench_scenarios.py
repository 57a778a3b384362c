"""`make bench`'s step scenarios (benchmarks/step_limits.py) build and step on the current code:
a method's refactor that breaks a scenario fails here, not in the next bench run."""

from __future__ import annotations

import importlib.util

import pytest
from torch.utils.flop_counter import FlopCounterMode

from fedssl import precision
from tests.fixtures import REPO


def step_limits():
    spec = importlib.util.spec_from_file_location("step_limits", REPO / "benchmarks/step_limits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("scenario", list(step_limits().SCENARIOS))
def test_each_step_scenario_builds_steps_and_counts_its_flops(scenario, monkeypatch):
    monkeypatch.chdir(REPO)  # the scenarios read the smoke presets
    make = step_limits().SCENARIOS[scenario]()
    with precision.policy("fp32"):
        step, images, counted = make()
        step()
        with FlopCounterMode(display=False) as flops:
            counted()
    assert images > 0
    assert flops.get_total_flops() > images * 1e5  # a real network's step, per image
