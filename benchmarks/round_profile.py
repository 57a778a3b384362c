"""Where our FedSimCLR round spends its CPU: ``torch.profiler`` over rounds of
``flower_peer.py``'s own side (the default pipeline's model and step, clients in turn, one
thread), operators by self CPU time; then a ReLU's backward, the operator that revealed mixed
memory layouts, over each layout pairing.

    python benchmarks/round_profile.py [--precision auto|fp32] [--clients 10] [--images 2000]
"""

from __future__ import annotations

import argparse

import torch
from flower_peer import run_ours
from fp32_layout import cpu_seconds
from torch.profiler import ProfilerActivity, profile

from fedssl.stage.runtime import cpu_summary


def relu_backward_ms(grad: torch.Tensor, out: torch.Tensor, repeats: int = 50) -> float:
    def backward():
        for _ in range(repeats):
            torch.ops.aten.threshold_backward(grad, out, 0)

    torch.ops.aten.threshold_backward(grad, out, 0)  # warm-up
    return cpu_seconds(backward) / repeats * 1e3


def relu_layouts() -> None:
    """A channels-last ReLU output (256 x 64 x 7 x 7) with a gradient in each layout."""
    cl = torch.channels_last
    out = torch.relu(torch.randn(256, 64, 7, 7)).contiguous(memory_format=cl)
    grads = {
        "channels-last": torch.randn(256, 64, 7, 7).contiguous(memory_format=cl),
        "contiguous (mixed)": torch.randn(256, 64, 7, 7),
        "broadcast view": torch.randn(256, 64, 1, 1).expand(256, 64, 7, 7),
    }
    for name, grad in grads.items():
        print(f"ReLU backward, channels-last output, {name} gradient: "
              f"{relu_backward_ms(grad, out):.2f} ms")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{cpu_summary()}; precision {args.precision}, {args.clients} clients, "
          f"{args.images} images, {args.rounds} rounds profiled after one")  # fmt: skip
    run_ours(args.clients, args.images, 1, args.precision, "off")  # warm-up: kernels, allocations
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_ours(args.clients, args.images, args.rounds, args.precision, "off")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12,
                                    max_name_column_width=36))  # fmt: skip
    relu_layouts()


if __name__ == "__main__":
    main()
