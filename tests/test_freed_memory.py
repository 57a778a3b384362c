"""Every stage keeps freed blocks in the heap (:func:`fedssl.stage.base.keep_freed_memory`): with
glibc's default policy each training step of the default model faults its activations' pages
in again (the kernel's share of a round's CPU: 26 %, ``results/bench/page_faults.txt``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedssl.stage import base

STEPS = """
import resource, sys, torch
from fedssl import precision
from fedssl.losses import nt_xent
from fedssl.models.encoders import ContrastiveModel
from fedssl.params import ModelParams
from fedssl.stage.base import keep_freed_memory

torch.set_num_threads(1)
if sys.argv[1] == "kept":
    assert keep_freed_memory()
with precision.policy("fp32_channels_last"):
    params = ModelParams(arch="small_cnn", norm="bn", width=16, proj_hidden=256, proj_dim=128)
    model = ContrastiveModel(params, (1, 28, 28)).to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters())
    x = torch.rand(256, 1, 28, 28).contiguous(memory_format=torch.channels_last)

    def step():
        z = model(x)
        loss = nt_xent(z[:128], z[128:], 0.2)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(3):  # warm-up: the heap and glibc's thresholds settle
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 8)
"""


def faults_a_step(policy: str) -> float:
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", STEPS, policy], capture_output=True, text=True, env=env, check=True
    )
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_step_reuses_its_freed_activations_instead_of_faulting_them_in_again():
    """The default model's step (2 x 128 views, batch norm, channels-last fp32) faults in
    thousands of pages a step under glibc's default policy, hardly any with the blocks kept
    (four runs of each here: 3,803-9,286 against 0-1,176 a step; glibc's dynamic thresholds
    make both vary from run to run, hence the margins)."""
    default, kept = faults_a_step("default"), faults_a_step("kept")
    assert default > 2000
    assert kept < default / 3


def test_the_users_own_allocator_settings_win(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert base.keep_freed_memory() is False
