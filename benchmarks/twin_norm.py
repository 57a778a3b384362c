"""Twin Norm forward + backward: the formula written directly (var_mean over the pair and the
group's values) against the library layer (each pair's views side by side through the fused
GroupNorm kernel), side by side in one process on the same input.

    python benchmarks/twin_norm.py [--device cuda]

prints one line per shape:
    twin_norm <shape>: direct <N> ms, library <M> ms, ratio <R>
"""

from __future__ import annotations

import argparse
import time

import torch

from fedssl.models.norms import TwinNorm
from fedssl.stage.base import set_threads


def direct_twin_norm(x, groups, weight, bias, eps=1e-5):
    """Eq. 2-3 as written: statistics over dims (view, group values) of [2, K, G, Λ·H·W]."""
    k = x.shape[0] // 2
    xg = x.reshape(2, k, groups, -1)
    var, mean = torch.var_mean(xg, dim=(0, 3), correction=0, keepdim=True)
    y = ((xg - mean) * torch.rsqrt(var + eps)).reshape_as(x)
    return y * weight.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)


def step_ms(fn, x, grad, device, repeats=20) -> float:
    for _ in range(3):
        fn(x).backward(grad)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(x).backward(grad)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(ap.parse_args().device)
    set_threads()  # as a stage: FEDSSL_THREADS, one thread unless set
    # MFCL client-module shapes: smoke (F-MNIST, width 16/32, K=32) and paper (CIFAR, 64, K=64)
    for shape, per_group in [((64, 16, 28, 28), 8), ((64, 32, 28, 28), 8), ((128, 64, 32, 32), 16)]:
        layer = TwinNorm(shape[1], per_group).to(device)
        x = torch.randn(shape, device=device, requires_grad=True)
        grad = torch.randn(shape, device=device)
        groups = layer.num_groups
        direct = step_ms(
            lambda v: direct_twin_norm(v, groups, layer.weight, layer.bias), x, grad, device
        )
        ours = step_ms(layer, x, grad, device)
        print(
            f"twin_norm {'x'.join(map(str, shape))}: direct {direct:.2f} ms, library "
            f"{ours:.2f} ms, ratio {direct / ours:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
