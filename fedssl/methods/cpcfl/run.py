"""CP-CFL step ``cfl``: clustered FL with a pool of N models (Alg. 2; the pool's hooks:
:mod:`fedssl.methods.cpcfl.pool`, its training: :mod:`fedssl.methods.cpcfl.federation`). The
pool's encoder comes from its source (:mod:`fedssl.methods.cpcfl.encoder_source`), IFCA's
failure rule may restart the pool (:mod:`fedssl.methods.cpcfl.trials`), and the step writes the
clients' personal evaluation, the pool, the traffic and the choice trace
(:mod:`fedssl.methods.cpcfl.outputs`). Its per-client costs: :mod:`fedssl.methods.cpcfl.costs`.

FedAvg is the pool of one; IFCA (None) a pool of fully random models with restarts on failure;
IFCA (FedAvg) a pool on the encoder of a FedAvg (None) warm-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from fedssl.data import to_device
from fedssl.eval.personal import PersonalLog, validation_accuracy, validation_images
from fedssl.fl.state import FedState, nbytes, write_round_log
from fedssl.methods.cpcfl import SSL_KINDS
from fedssl.methods.cpcfl.encoder_source import fedavg_warmup, pretrained_encoder
from fedssl.methods.cpcfl.outputs import communication, write_choices
from fedssl.methods.cpcfl.pool import PoolStrategy
from fedssl.methods.cpcfl.trials import run_trials
from fedssl.rounds.runner import train_data
from fedssl.stage.runtime import write_json

if TYPE_CHECKING:
    from fedssl.stage.contract import StepContext


def run(ctx: StepContext) -> None:
    p, c = ctx.exp.method, ctx.exp.method.federation
    data = train_data(ctx)
    shape = tuple(data.images.shape[1:])
    num_classes = int(data.labels.max()) + 1
    tests = personal_tests(ctx)
    groups = ctx.true_groups()
    extra: dict = {"explore_rounds": c.explore_rounds, "clusters": c.clusters}
    parts: list[tuple[str, int, FedState]] = []  # every federation run: (ledger prefix, N, state)

    encoder = None
    if p.pretrain in SSL_KINDS:
        encoder, about = pretrained_encoder(ctx, data, shape, num_classes)
        extra.update(about)
    elif p.pretrain == "fedavg":
        encoder, warmup = fedavg_warmup(ctx, data, shape, num_classes)
        parts.append(("warmup/", 1, warmup))

    fed, state, failed = run_trials(ctx, data, shape, num_classes, encoder, tests, groups)
    write_round_log(state.log, ctx.results_dir / "rounds.tsv")
    parts += [*failed, ("", c.clusters, state)]
    extra.update(
        restarts=len(failed),
        first_attempt_failed=len(failed) > 0 or state.memo.get("failed_at") is not None,
    )
    save_outputs(ctx, fed.strategy, state, parts, data.sizes(), extra, groups)
    remove_checkpoints(ctx)


def personal_tests(ctx: StepContext):
    """The test split on the device and each client's test indices (the pool's evaluate hook)."""
    images, labels = ctx.split("test")
    return (
        to_device(images, ctx.device),
        torch.as_tensor(np.asarray(labels), dtype=torch.int64, device=ctx.device),
        ctx.client_tests(),
    )


def save_outputs(
    ctx: StepContext, strategy: PoolStrategy, state: FedState, parts, sizes, extra: dict, groups
) -> None:
    c = ctx.exp.method.federation
    accs, labels, probs = strategy.outputs(state)
    val = validation_accuracy(strategy.scorer(state), validation_images(ctx))
    PersonalLog(state.memo).save(ctx.out / "personal.npz", labels, probs, val)
    choices = np.asarray(state.memo["personal"]["choice"], dtype=np.int64)
    write_choices(choices, groups, c.explore_rounds, ctx.results_dir)
    pool = {f"pool{n}": strategy.model(state, n) for n in range(c.clusters)}
    torch.save(pool, ctx.out / "pool.pt")
    write_json(ctx.out / "communication.json", communication(parts, sizes))
    write_json(ctx.out / "extra_metrics.json", extra)
    first = strategy.model(state, 0)
    ctx.info.update(
        rounds=len(state.log),
        final_loss=state.log[-1]["loss"],
        restarts=extra["restarts"],
        parameters=sum(v.numel() for v in first.values() if v.is_floating_point()),
        model_bytes=nbytes(first),
        final_personal_acc=round(float(np.mean(accs)), 2),
    )


def remove_checkpoints(ctx: StepContext) -> None:
    """The attempts' and the warm-up's resume checkpoints (``<stage>.<part>.pt``)."""
    for path in ctx.resume_path.parent.glob(ctx.resume_path.stem + ".*.pt"):
        path.unlink(missing_ok=True)
