"""A method's federated step run as a Flower app in Flower's simulation engine, writing the
very outputs of the simulator's stage (``python -m stages.flower STEP EXPERIMENT``).

The ``ServerApp`` runs the step's own runner (model, round log, ledger, checkpoint: the files
the probes, costs and report read); only its federation's rounds go through Flower, one
SuperNode per client of the partition, each building the step's federation with the method's
``flower_steps`` hook.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from fedssl.methods.hooks import Hook, call_hook
from fedssl.stage.runtime import StageFailed, pick_device

if TYPE_CHECKING:
    from fedssl.stage.context import StageContext


def flower_hook(method, step: str) -> Hook:
    if step not in method.flower_steps:
        ready = ", ".join(method.flower_steps) or "none"
        raise StageFailed(
            f"method '{method.name}' cannot run step '{step}' as a Flower app (its Flower-ready "
            f"steps: {ready}; see the README's 'Running as a Flower app')"
        )
    return method.flower_steps[step]


class StepFederation:
    """What a SuperNode builds (in its own process): the federation of stage ``<step>__
    <experiment>`` of the project at ``root``, from the same params and partition."""

    def __init__(self, root: Path, step: str, experiment: str):
        self.root, self.step, self.experiment = Path(root).resolve(), step, experiment

    def context(self):
        """The stage's context in this process, computing as the stage's server side does:
        its threads, device and precision set by the stage's own
        :meth:`~fedssl.stage.context.StageContext.compute_settings` (float sums depend on them)."""
        from fedssl import precision
        from fedssl.stage.context import StageContext

        os.chdir(self.root)  # the project's params/ and artifacts/ (a SuperNode's own process)
        ctx = StageContext(self.step, self.experiment)
        ctx.compute_settings()
        precision.use(ctx.exp.precision)  # for good: no block encloses a node's work
        ctx.device = ctx.device or pick_device()
        return ctx

    def __call__(self, context=None, ctx: StageContext | None = None):
        """(model, Federation) of the step, in ``ctx`` (default: a fresh :meth:`context`)."""
        ctx = ctx or self.context()
        return call_hook(flower_hook(ctx.method, self.step), ctx)


def run_step(ctx: StageContext, step: str) -> None:
    """Run ``step`` of the context's experiment with its rounds in Flower's simulation."""
    try:
        from fedssl.flower.app import simulate
    except ImportError as e:
        raise StageFailed(f"Flower is not installed ({e}): pip install -e '.[flower]'") from None
    check_step(ctx, step)
    clients = ctx.partition.num_clients
    simulate(
        lambda trainer: run_with(ctx, step, trainer),
        StepFederation(Path.cwd(), step, ctx.name),
        clients,
    )
    ctx.run_info["engine"] = f"flower simulation, {clients} SuperNodes"


def check_step(ctx: StageContext, step: str) -> None:
    """Build once, here, what every client will build: a step or variant that does not map
    (MpFedcon's SCAFFOLD) fails before any SuperNode starts."""
    call_hook(flower_hook(ctx.method, step), ctx)


def run_with(ctx: StageContext, step: str, trainer) -> None:
    """Run ``step`` with its federation's rounds carried by ``trainer`` (the step's runner
    hands it to :func:`fedssl.rounds.runner.run_federation`)."""
    ctx.remote_rounds = trainer
    ctx.method.run_step(step, ctx)
