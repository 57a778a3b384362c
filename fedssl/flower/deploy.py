"""The Flower app of a real deployment (``fedssl/flower/flwr_app``, submitted with ``flwr
run``): the ServerApp runs stage ``<step>__<experiment>`` of the project at the root fixed when
its SuperLink started (``python -m fedssl.flower superlink --root``), with the same outputs and
stage folder as ``python -m stages.flower``; its rounds go through the SuperLink to SuperNodes,
each started with ``--node-config "partition-id=K root='/its/project'"`` (client K, its own
copy of the project, fixed by whoever runs the node).

Before the first round the server asks every node which client it is and checks, at once:
as many nodes as the experiment has clients (else one line and a non-zero exit, after
``node-wait`` seconds for them to connect); each node's step fingerprint (params and code) and
its data set and partition digests equal the server's. A node derives a missing data set or
partition itself from the same params (they are deterministic for their seed) before it
answers. A node lost mid-run ends the run with one line naming the client and how to resume.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedssl.flower.app import PARTITION_ID, GridExchange, client_app
from fedssl.flower.rounds import RemoteRounds
from fedssl.flower.stage import StepFederation, check_step, run_with
from fedssl.flower.superlink import ROOT_ENV
from fedssl.stage.runtime import StageFailed

DERIVED_KINDS = ("prepare_data", "partition")  # what a node may compute for itself, in order


def step_of(context: Context) -> tuple[str, str]:
    """(step, experiment) from the run config."""
    cfg = context.run_config
    missing = [k for k in ("step", "experiment") if not cfg.get(k)]
    if missing:
        raise StageFailed(f"the Flower run config lacks {', '.join(missing)}")
    return str(cfg["step"]), str(cfg["experiment"])


def server_root() -> Path:
    root = os.environ.get(ROOT_ENV)
    if not root:
        raise StageFailed(
            f"this SuperLink has no project root ({ROOT_ENV} unset): start it with "
            "`python -m fedssl.flower superlink --credentials DIR --root PROJECT`"
        )
    return Path(root)


def node_root(context: Context) -> Path:
    root = context.node_config.get("root")
    if not root:
        raise StageFailed(
            "this SuperNode has no project root: start it with "
            "--node-config \"partition-id=K root='/path/to/project'\""
        )
    return Path(str(root))


# ---------------------------------------------------------------------------- what must agree
def agreement(ctx) -> dict[str, str]:
    """What server and nodes must share: the step's fingerprint (params, code) and the output
    digest of each data set and partition stage it reads."""
    import json

    facts = {"fingerprint": ctx.fingerprint}
    for name, stage in ctx.record["inputs"].items():
        if stage["kind"] in DERIVED_KINDS:
            meta = json.loads((Path(stage["out"]) / "meta.json").read_text())
            facts[name] = meta["output_digest"]
    return facts


def derive_inputs(ctx) -> None:
    """Run, on this node, the data set and partition stages of the step whose outputs are
    missing (the same commands the front ends run)."""
    from fedssl.stage.base import plan_record

    for kind in DERIVED_KINDS:
        for name, stage in ctx.record["inputs"].items():
            if stage["kind"] == kind and not (Path(stage["out"]) / "meta.json").is_file():
                _, *args = plan_record(kind, name.split("__", 1)[1])["command"].split()
                subprocess.run([sys.executable, *args], check=True)


def compare(server: dict, node: dict, client: int) -> None:
    differ = sorted(k for k in server if server[k] != node.get(k))
    if differ:
        what = ", ".join("params or code" if k == "fingerprint" else k for k in differ)
        raise StageFailed(
            f"the SuperNode of client {client} has another {what} than the server: "
            "check out the same commit and params on every machine"
        )


# ---------------------------------------------------------------------------- the apps
server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    from fedssl.stage.context import StageContext

    step, experiment = step_of(context)
    os.chdir(server_root())
    ctx = StageContext(step, experiment)
    wait = float(context.run_config.get("node-wait", 30))
    try:
        derive_inputs(ctx)
        with ctx.run():
            check_step(ctx, step)
            clients = ctx.partition.num_clients
            exchange = GridExchange(grid, clients, wait, agreement(ctx), compare)
            run_with(ctx, step, RemoteRounds(exchange))
            ctx.run_info["engine"] = f"flower deployment, {clients} SuperNodes"
        ctx.done()
    except StageFailed as e:  # Flower marks the run failed with this line as its details
        raise StageFailed(f"{ctx.stage_name}: {e}") from None


class NodeFederation:
    """What a SuperNode builds, once: its step's federation from its own project root, after
    deriving a missing data set or partition; it answers the server's query with its client
    and what must agree."""

    def __init__(self):
        self.facts: dict[str, str] | None = None

    def __call__(self, context: Context):
        from fedssl.stage.context import StageContext

        step, experiment = step_of(context)
        os.chdir(node_root(context))
        ctx = StageContext(step, experiment)
        derive_inputs(ctx)
        self.facts = agreement(ctx)
        return StepFederation(Path.cwd(), step, experiment)()

    def who(self, context: Context) -> ConfigRecord:
        me = int(context.node_config[PARTITION_ID])
        return ConfigRecord({"client": me, **(self.facts or {})})


node = NodeFederation()
client = client_app(node, who=node.who)
