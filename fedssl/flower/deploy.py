"""The Flower app of a real deployment: ``flwr run`` submits it to a SuperLink, and every
SuperNode started with ``--node-config "partition-id=K"`` is client K. The run config names
the project folder (the same params and partition on every machine), the experiment and the
step. The server app runs that stage as ``python -m stages.flower`` does (same outputs, same
stage folder), with its rounds going through the SuperLink to the nodes.

Components for a Flower app's ``pyproject.toml``: ``serverapp = "fedssl.flower.deploy:server"``,
``clientapp = "fedssl.flower.deploy:client"`` (see ``tests/flower_app``).
"""

from __future__ import annotations

import os

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedssl.flower.app import GridExchange, client_app
from fedssl.flower.rounds import RemoteRounds
from fedssl.flower.stage import StepFederation, check_step, run_with


def stage_of(context: Context) -> tuple[str, str, str]:
    """(project folder, step, experiment) from the run config."""
    cfg = context.run_config
    missing = [k for k in ("root", "step", "experiment") if not cfg.get(k)]
    if missing:
        raise ValueError(f"the Flower run config lacks {', '.join(missing)}")
    return str(cfg["root"]), str(cfg["step"]), str(cfg["experiment"])


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    from fedssl.stage import StageContext

    root, step, experiment = stage_of(context)
    os.chdir(root)
    ctx = StageContext(step, experiment)
    with ctx.run():
        check_step(ctx, step)
        clients = ctx.partition.num_clients
        run_with(ctx, step, RemoteRounds(GridExchange(grid, clients)))
        ctx.run_info["engine"] = f"flower deployment, {clients} SuperNodes"
    ctx.done()


client = client_app(lambda context: StepFederation(*stage_of(context))())
