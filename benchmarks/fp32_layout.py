"""Which memory layout is faster for a step in plain fp32: the training step of each
convolutional family of ``step_limits.py`` (the step as the cohort trainer runs it: the
method's loss on the model's own tensors, backward, Adam), once with the model and its weights
contiguous (the ``fp32`` setting's layout) and once channels-last (the layout the bf16 path
uses), one thread, CPU seconds of the process, interleaved (contiguous, channels-last,
contiguous, ...) so other jobs on the machine hit both alike. Ratio: contiguous /
channels-last (> 1: channels-last is faster).

    python benchmarks/fp32_layout.py [--repeats 6] [--only simclr_cnn ...] [--compiled]

``--compiled``: the same comparison for the step the engine compiles (``compile: on``; the
cohort trainer's own step, as ``compiled_step.py`` times it), contiguous against channels-last
in fp32 (the ``fp32`` and ``fp32_channels_last`` settings): whether channels-last speeds up a
compiled step too.

Why: at 10 clients our fp32 round is the model's steps (``federated_round.py`` times them
alone), so a faster fp32 round has to come from a faster step; on a CPU without native bf16
`auto` computes in fp32, channels-last, and the `fp32` setting contiguous.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from step_limits import mfcl_autoencoder, personalised_cnn, simclr_cnn

from fedssl import precision
from fedssl.models.autoencoder import ClientAutoencoder
from fedssl.stage.runtime import cpu_summary


def resnet_autoencoder(norm: str):
    """MFCL's ResNet-18 autoencoder step with another norm (``step_limits`` has Twin Norm's):
    which norm makes channels-last slower."""

    def scenario():
        build, loss, batch = mfcl_autoencoder()

        def build_with():
            torch.manual_seed(0)
            return ClientAutoencoder(
                "resnet18", in_channels=1, width=32, norm=norm, channels_per_group=8
            )

        return build_with, loss, batch

    return scenario


SCENARIOS = {
    "simclr_cnn": simclr_cnn,
    "personalised_cnn": personalised_cnn,
    "mfcl_autoencoder": mfcl_autoencoder,  # Twin Norm
    "resnet_autoencoder_bn": resnet_autoencoder("bn"),
    "resnet_autoencoder_gn": resnet_autoencoder("gn"),
}
CL = torch.channels_last


def make_step(build, loss_fn, batch, channels_last: bool):
    """The step of ``step_limits.model_step`` in fp32, in one layout; it returns its loss."""
    with precision.policy("fp32"):
        model = build()
    if channels_last:
        model = model.to(memory_format=CL)
    params = {
        k: (v.detach().contiguous(memory_format=CL) if channels_last and v.dim() == 4 else
            v.detach().clone()).requires_grad_(v.requires_grad)
        for k, v in model.named_parameters()
    }  # fmt: skip
    buffers = dict(model.named_buffers())
    opt = torch.optim.Adam([q for q in params.values() if q.requires_grad], lr=1e-3)

    def step():
        with precision.policy("fp32"):
            loss = loss_fn(model, params, buffers, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def compiled_step(build, loss_fn, batch, channels_last: bool):
    """The cohort trainer's compiled fp32 step (``compiled_step.Step``) in one layout: the
    ``fp32`` setting's or ``fp32_channels_last``'s."""
    from compiled_step import Step

    setting = "fp32_channels_last" if channels_last else "fp32"
    with precision.policy(setting):
        step = Step(build, loss_fn, batch, "on")

    def run():
        with precision.policy(setting):
            return step()

    return run


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--only", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--compiled", action="store_true", help="the compiled step (compile: on)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    kind = "compiled" if args.compiled else "eager"
    print(f"{cpu_summary()}; fp32, {kind}, 1 thread, {args.repeats} interleaved repeats of 2 steps")
    make = compiled_step if args.compiled else make_step
    for name in args.only:
        scenario = SCENARIOS[name]()
        steps = {layout: make(*scenario, layout) for layout in (False, True)}
        for step in steps.values():
            step()  # warm-up: allocations, kernel selection
        seconds = {layout: [] for layout in steps}
        for _ in range(args.repeats):
            for layout, step in steps.items():
                seconds[layout].append(cpu_seconds(lambda: (step(), step())) / 2)
        contiguous, last = (statistics.median(seconds[k]) for k in (False, True))
        ratio = contiguous / last
        print(f"{name}: contiguous {contiguous * 1000:.1f} ms a step, channels-last "
              f"{last * 1000:.1f} ms, contiguous / channels-last {ratio:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
