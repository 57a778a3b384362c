"""The ResNet shortcut's strided 1x1 convolution: the same function as ``nn.Conv2d``, and a
training step that survives oneDNN's AVX2 kernels (the kernels of a CPU without AVX-512)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from fedssl.models.pointwise import StridedPointwise, subsampled
from tests.fixtures import REPO

CL = torch.channels_last


@pytest.mark.parametrize("cin", [4, 8])  # 4: the subsampled path; 8: the strided kernel
def test_it_is_the_strided_convolution_in_value_and_gradient(cin):
    torch.manual_seed(0)
    ours, plain = StridedPointwise(cin, 6, 2), nn.Conv2d(cin, 6, 1, 2, bias=False)
    assert subsampled(ours, torch.empty(1, cin, 3, 3).contiguous(memory_format=CL)) == (cin == 4)
    plain.weight.data.copy_(ours.weight.data)
    x = torch.randn(5, cin, 9, 9).contiguous(memory_format=CL).requires_grad_(True)
    grad_out = torch.randn(5, 6, 5, 5)
    got = [ours(x), *torch.autograd.grad(ours(x), [x, ours.weight], grad_out)]
    want = [plain(x), *torch.autograd.grad(plain(x), [x, plain.weight], grad_out)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


STEP = """
import torch
from fedssl.models.encoders import CifarResNet18
from fedssl.models.rserver import RServerModule
from fedssl.models.split import split_resnet18
torch.manual_seed(0)
for net, shape in ((CifarResNet18(1, 4, "bn", 2), (48, 1, 28, 28)),
                   (RServerModule("resnet50", 6, 4), (48, 6, 14, 14)),
                   (split_resnet18(4, in_channels=1, channels_per_group=2), (48, 1, 28, 28))):
    net = net.to(memory_format=torch.channels_last)
    for _ in range(3):
        x = torch.randn(shape).contiguous(memory_format=torch.channels_last).requires_grad_(True)
        torch.autograd.grad(net(x).square().sum(), [x, *net.parameters()])
print("ok")
"""


def test_a_narrow_resnet_trains_channels_last_with_onednns_avx2_kernels():
    """Widths that are not multiples of 8 (the tests' tiny ResNets): with oneDNN capped at
    AVX2, the strided 1x1 kernel's weight gradient corrupted the heap (the process aborted,
    `double free or corruption`); the shortcut's subsampled form trains."""
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", STEP], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
