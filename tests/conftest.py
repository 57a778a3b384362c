"""Fixtures shared by several test modules."""

import os
import sys
from pathlib import Path

import pytest
import torch

# The project's tools (python, snakemake, dvc) come from the environment running the tests,
# whatever PATH the shell had: `.venv/bin/pytest` works without activating the environment.
TOOLS = str(Path(sys.executable).parent)
os.environ["PATH"] = os.pathsep.join([TOOLS, os.environ.get("PATH", "")])


@pytest.fixture(autouse=True)
def fp32_library_calls():
    """Library code called by a test computes in fp32 (tests compare code paths exactly) unless
    the test or a stage's experiment sets another precision: auto would pick bf16 on a CPU that
    computes it natively."""
    from fedssl import precision

    with precision.policy("fp32"):
        yield


@pytest.fixture
def one_thread():
    """Torch on one thread: tiny models (double backward, many small convs) run far slower when
    two threads fight the other jobs of a 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
