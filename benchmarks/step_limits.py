"""How close one training step comes to the machine: per method family, the step alone on
ready-made views in fp32 and under the precision policy (``auto``: bf16 autocast and
channels-last where the device computes bf16 natively), the FLOPs of a step, the fraction of
the measured matmul peak (fp32, bf16) each reaches, and the scenario's peak memory.

    python benchmarks/step_limits.py [--repeats 5] [--threads 1] [--only simclr_cnn ...]

The step is the method's own loss function (as its cohort trainer calls it) with backward and
an Adam step. Each scenario runs in its own process, so its peak memory is its own; the timings
are medians over interleaved repeats (fp32, policy, fp32, policy, ...), so load from the
machine's other jobs hits both alike. The round against the conventional loop is
``federated_round.py`` (SimCLR, MFCL) and ``split_step.py`` (the split step).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils.flop_counter import FlopCounterMode

from fedssl import precision
from fedssl.presets import Presets
from fedssl.stage.base import bound_kernel_cache
from fedssl.stage.runtime import cpu_summary

SHAPE = (1, 28, 28)
HERE = Path(__file__).resolve().parent


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- scenarios
def views(n: int, count: int = 2, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.rand(n, *SHAPE, generator=g) for _ in range(count))


def batch_of(xs: tuple, labels=None) -> SimpleNamespace:
    n = len(xs[0])
    return SimpleNamespace(views=xs, valid=torch.ones(n, dtype=torch.bool), labels=labels)


def method_params(experiment: str):
    return Presets().load("experiment", experiment).method


def simclr_cnn():
    """The default pipeline's step: FedSimCLR's BN CNN on 2 x 128 views, NT-Xent."""
    from fedssl.methods.federated import trainer_loss
    from fedssl.models.encoders import seeded_contrastive_model

    p = method_params("fmnist_fedsimclr")
    build = lambda: seeded_contrastive_model(p.model, SHAPE, p.seed, torch.device("cpu"))  # noqa: E731
    return build, trainer_loss(p), batch_of(views(p.federation.batch_size))


def mfcl_autoencoder():
    """MFCL phase 1: the client's Twin-Norm ResNet-18 autoencoder (width 32) on 2 x 32 views."""
    from fedssl.methods.mfcl.run import autoencoder_loss
    from fedssl.models.autoencoder import ClientAutoencoder

    def build():
        torch.manual_seed(0)
        return ClientAutoencoder(
            "resnet18", in_channels=1, width=32, norm="tn", channels_per_group=8
        )

    return build, autoencoder_loss(), batch_of(views(32))


def moco_v3_vit():
    """LW-FedSSL's smoke FedMoCo: a 6-block ViT of width 64 with MoCo v3 heads, 2 x 64 views."""
    from fedssl.methods.lwfedssl.run import initial_online, learner_loss, learner_of

    p = method_params("smoke_fedmoco")

    def build():
        online = initial_online(p, SHAPE, p.vit.depth)
        return learner_of(p, online, None, p.plan(None))

    return build, learner_loss, batch_of(views(p.federation.batch_size))


def personalised_cnn():
    """MpFedcon's smoke party network (a CNN with its anchor) on 64 labelled images: its body
    step, cross-entropy + mu * the model-contrastive loss against class centres (Eq. 6)."""
    from fedssl.methods.mpfedcon.nets import Anchored, build_net
    from fedssl.methods.mpfedcon.train import contrast_loss

    p = method_params("smoke_mpfedcon")

    def build():
        torch.manual_seed(0)
        model = Anchored(build_net(p, SHAPE, 10), 10)
        model.centres.normal_()
        model.has_centre.fill_(1)
        return model

    labels = torch.arange(64) % 10
    return build, contrast_loss(p.mu, p.temperature), batch_of(views(64, count=1), labels)


def model_step(build, loss_fn, batch):
    """One step as a cohort of one runs it: the loss on the model's own tensors, backward, Adam.
    Returns (the step, images per step, the step whose FLOPs are counted: the same)."""
    model = build()
    # the trainer's copy of the weights, laid out as the cohort trainer lays them out
    params = {
        k: precision.laid_out(v.detach().clone()).requires_grad_(v.requires_grad)
        for k, v in model.named_parameters()
    }
    buffers = dict(model.named_buffers())
    opt = torch.optim.Adam([q for q in params.values() if q.requires_grad], lr=1e-3)

    def step():
        loss = loss_fn(model, params, buffers, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step, len(batch.views) * len(batch.views[0]), step


def split_step_scenario():
    """MonAcoSFL's split step: 5 clients x 20 images, cut 4 of a width-8 GN+WS ResNet-18, the
    server's MoCo step on their activations (the trainer of ``split_step.py``, per-client
    loop). Its FLOPs are counted on that file's conventional step, the same work (the trainer's
    ``autograd.grad`` escapes torch's FLOP counter)."""
    sys.path.insert(0, str(HERE))
    import numpy as np
    from split_step import Conventional, ours, params

    from fedssl.data.augment import to_float
    from fedssl.fl.cohort import LocalData
    from fedssl.methods.mocosfl.nets import build_nets

    n, b, cpu = 5, 20, torch.device("cpu")
    p = params(b, 4, 8)
    images = torch.randint(0, 256, (n * b, *SHAPE), dtype=torch.uint8)
    data = LocalData(
        images,
        torch.zeros(n * b, dtype=torch.int64),
        [np.arange(i * b, (i + 1) * b) for i in range(n)],
    )

    def make():
        x1 = list(to_float(images).split(b))
        same_work = Conventional(build_nets(p, SHAPE, cpu), n, p, cpu)
        count = lambda: same_work.step(x1, [v.flip(-1) for v in x1])  # noqa: E731
        return ours(build_nets(p, SHAPE, cpu), p, data, False), 2 * n * b, count

    return make


SCENARIOS = {
    "simclr_cnn": lambda: lambda: model_step(*simclr_cnn()),
    "mfcl_autoencoder": lambda: lambda: model_step(*mfcl_autoencoder()),
    "moco_v3_vit": lambda: lambda: model_step(*moco_v3_vit()),
    "split_step": split_step_scenario,
    "personalised_cnn": lambda: lambda: model_step(*personalised_cnn()),
}


def run_scenario(name: str, repeats: int, steps: int) -> dict:
    """In a child process: FLOPs of one step, then interleaved timed steps in fp32 and under
    the policy; the process's peak memory."""
    base = rss_mb()
    make = SCENARIOS[name]()
    contenders = {}
    for setting in ("fp32", "auto"):
        with precision.policy(setting):
            step, images, counted = make()
            step()  # warm-up: allocations, kernel selection
        contenders[setting] = step
        if setting == "fp32":
            with precision.policy("fp32"), FlopCounterMode(display=False) as flops:
                counted()
    seconds = {s: [] for s in contenders}
    matmuls = matmul_contenders()
    matmul_seconds = {dt: [] for dt in matmuls}
    for _ in range(repeats):  # the steps and the matmul peak, in turns
        for setting, step in contenders.items():
            with precision.policy(setting):
                seconds[setting].append(timed(lambda: [step() for _ in range(steps)]) / steps)
        for dt, matmul in matmuls.items():
            matmul_seconds[dt].append(timed(matmul))
    return {
        "scenario": name,
        "images_per_step": images,
        "flops_per_step": flops.get_total_flops(),
        "seconds_per_step": {s: statistics.median(v) for s, v in seconds.items()},
        "policy_computes": precision.resolved("cpu", "auto"),
        "peak_gflops": {
            dt: MATMUL_FLOPS / statistics.median(v) / 1e9 for dt, v in matmul_seconds.items()
        },
        "peak_rss_mb": rss_mb(),
        "rss_after_import_mb": base,
    }


# ----------------------------------------------------------------------------- the peak
MATMUL_SIZE = 2048
MATMUL_FLOPS = 2 * MATMUL_SIZE**3


def matmul_contenders() -> dict:
    """fp32 / bf16 -> one square matmul (warmed up): the machine's measured peak; fp32 alone on
    a CPU that emulates bf16 (one emulated 2048^2 product takes minutes there)."""
    out = {}
    dtypes = (("fp32", torch.float32), ("bf16", torch.bfloat16))
    for label, dt in dtypes if precision.native_bf16("cpu") else dtypes[:1]:
        a, b = (torch.randn(MATMUL_SIZE, MATMUL_SIZE).to(dt) for _ in range(2))
        a @ b
        out[label] = lambda a=a, b=b: a @ b
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timed repeats")
    ap.add_argument("--steps", type=int, default=2, help="steps per timed repeat")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default one core)")
    ap.add_argument("--only", nargs="*", default=None, choices=list(SCENARIOS))
    ap.add_argument("--timeout", type=float, default=300, help="seconds per scenario at most")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    bound_kernel_cache()  # as every stage does
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(run_scenario(args.child, args.repeats, args.steps)))
        return
    print(
        f"{cpu_summary()}; {args.threads} thread(s); the policy (auto) computes in "
        f"{precision.resolved('cpu', 'auto')}; medians of {args.repeats} interleaved repeats; "
        f"the peak is a {MATMUL_SIZE}^2 matmul timed in the same turns",
        flush=True,
    )
    if not precision.native_bf16("cpu"):
        print("no native bf16 on this CPU: its emulated bf16 is not timed (fp32 peak only)")
    for name in args.only or SCENARIOS:
        cmd = [sys.executable, __file__, "--child", name, "--repeats", str(args.repeats)]
        cmd += ["--steps", str(args.steps), "--threads", str(args.threads)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{name}: stopped after {args.timeout:.0f} s (--timeout)", flush=True)
            continue
        if proc.returncode:
            print(f"{name}: failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
            continue
        print(report_line(json.loads(proc.stdout)), flush=True)


def report_line(r: dict) -> str:
    flops, n, peak = r["flops_per_step"], r["images_per_step"], r["peak_gflops"]
    t32, tpol = r["seconds_per_step"]["fp32"], r["seconds_per_step"]["auto"]
    pol = r["policy_computes"]
    return (
        f"{r['scenario']}: {n} img/step, {flops / 1e9:.2f} GFLOP/step; fp32 {n / t32:.0f} img/s "
        f"({flops / t32 / 1e9:.1f} GFLOP/s = {flops / t32 / 1e9 / peak['fp32']:.0%} of fp32 "
        f"peak {peak['fp32']:.0f}); policy ({pol}) {n / tpol:.0f} img/s ({flops / tpol / 1e9:.1f}"
        f" GFLOP/s = {flops / tpol / 1e9 / peak[pol]:.0%} of {pol} peak {peak[pol]:.0f}), "
        f"x{t32 / tpol:.2f}; peak memory {r['peak_rss_mb']:.0f} MB "
        f"({r['rss_after_import_mb']:.0f} after import)"
    )


if __name__ == "__main__":
    main()
