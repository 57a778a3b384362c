"""The Flower app of a real deployment (``fedssl/flower/flwr_app``, submitted with ``flwr
run``): the ServerApp runs stage ``<step>__<experiment>`` of the project at the root fixed when
its SuperLink started (``python -m fedssl.flower superlink --root``), with the same outputs and
stage folder as ``python -m stages.flower``; its rounds go through the SuperLink to SuperNodes,
each started with ``--node-config "partition-id=K root='/its/project'"`` (client K, its own
copy of the project, fixed by whoever runs the node).

Before the first round the server asks every node which client it is and checks, at once:
as many nodes as the experiment has clients (else one line and a non-zero exit, after
``node-wait`` seconds for them to connect); each node's params, code, data set and partition
digests and compute settings (device, threads, precision), computed as the server's by
:func:`agreement`, equal the server's (else one line naming each field that differs). A node
derives a missing data set or partition itself from the same params (they are deterministic
for their seed) before it answers. A node lost mid-run, or one that has not replied within
``reply-wait`` seconds, ends the run with one line naming the client and how to resume.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedssl.flower.app import PARTITION_ID, GridExchange, client_app
from fedssl.flower.rounds import RemoteRounds
from fedssl.flower.stage import StepFederation, check_step, run_with
from fedssl.flower.superlink import ROOT_ENV
from fedssl.stage.runtime import StageFailed

if TYPE_CHECKING:
    from fedssl.stage.context import StageContext

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
SETTINGS_ENV = {"device": "FEDSSL_DEVICE", "threads": "FEDSSL_THREADS"}


def agreement(ctx: StageContext) -> dict[str, str]:
    """What server and nodes must share, field by field, computed the same way on both sides
    (the stage's fingerprint inputs and compute settings, once :meth:`compute_settings` ran):
    the params, each code file, the command and plan record, the digest of each data set and
    partition it reads, and the device, threads and precision the numbers depend on."""
    from fedssl.stage.record import fingerprint

    inputs = ctx.fingerprint_inputs
    facts = {"params": fingerprint(inputs["params"]), "command": inputs["cmd"]}
    facts["plan"] = inputs["plan"]
    facts.update({f"code {path}": digest for path, digest in inputs["code"].items()})
    for name, stage in ctx.record["inputs"].items():
        if stage["kind"] in DERIVED_KINDS:  # what a node derives; the rest it does not read
            facts[name] = str(inputs["upstream"][name])
    facts.update({name: str(value) for name, value in ctx.settings.items()})
    return facts


def advice(fields: list[str]) -> str:
    """How to make a node agree, for the fields that differ."""
    said = []
    if any(f in ("params", "command", "plan") or f.startswith("code ") for f in fields):
        said.append("check out the same commit and params on every machine")
    if [f for f in fields if f in SETTINGS_ENV]:
        env = " and ".join(SETTINGS_ENV[f] for f in fields if f in SETTINGS_ENV)
        said.append(f"set {env} alike on every machine")
    if "precision" in fields:
        said.append("precision 'auto' resolved differently: set fp32 or bf16 in the params")
    if [f for f in fields if "__" in f]:
        said.append("delete the node's copy of that output so it derives it again")
    return "; ".join(said)


def compare(server: dict, node: dict, client: int) -> None:
    """Refuse a node whose facts differ from the server's, naming each field with both
    values (digests shortened)."""
    differ = sorted(k for k in server if str(server[k]) != str(node.get(k)))
    if differ:
        what = ", ".join(
            f"{k} (node {_short(node.get(k))}, server {_short(server[k])})" for k in differ
        )
        raise StageFailed(
            f"the SuperNode of client {client} differs from the server in {what}: {advice(differ)}"
        )


def _short(value) -> str:
    """A digest by its first 12 digits (enough to tell two apart); anything else as it is."""
    value = "none" if value is None else str(value)
    return value[:12] if re.fullmatch("[0-9a-f]{64}", value) else value


def derive_inputs(ctx: StageContext) -> None:
    """Run, on this node, the data set and partition stages of the step whose outputs are
    missing (the same commands the front ends run)."""
    from fedssl.stage.base import plan_record

    for kind in DERIVED_KINDS:
        for name, stage in ctx.record["inputs"].items():
            if stage["kind"] == kind and not (Path(stage["out"]) / "meta.json").is_file():
                _, *args = plan_record(kind, name.split("__", 1)[1])["command"].split()
                subprocess.run([sys.executable, *args], check=True)


# ---------------------------------------------------------------------------- the apps
server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    from fedssl.stage.context import StageContext

    step, experiment = step_of(context)
    os.chdir(server_root())
    ctx = StageContext(step, experiment)
    wait = float(context.run_config["node-wait"])
    reply_wait = float(context.run_config["reply-wait"])  # the app's pyproject.toml sets it
    try:
        derive_inputs(ctx)
        with ctx.run():
            check_step(ctx, step)
            clients = ctx.partition.num_clients
            exchange = GridExchange(grid, clients, wait, agreement(ctx), compare, reply_wait)
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
        step, experiment = step_of(context)
        build = StepFederation(node_root(context), step, experiment)
        ctx = build.context()
        derive_inputs(ctx)
        self.facts = agreement(ctx)
        return build(ctx=ctx)

    def who(self, context: Context) -> ConfigRecord:
        me = int(context.node_config[PARTITION_ID])
        return ConfigRecord({"client": me, **(self.facts or {})})


node = NodeFederation()
client = client_app(node, who=node.who)
