"""The deployment's server and nodes, without a network (the deployment itself:
tests/flower/test_flower_local.py): a SuperNode describes itself (params, code, data,
compute settings) exactly as the server does inside its stage, a node that differs is told
which field and both values, and a reply that never comes ends the run at its deadline with
one line naming the client."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("flwr")

from fedssl import precision  # noqa: E402
from fedssl.flower.app import GridExchange  # noqa: E402
from fedssl.flower.deploy import NodeFederation, agreement, compare  # noqa: E402
from fedssl.stage.context import StageContext  # noqa: E402
from fedssl.stage.runtime import StageFailed  # noqa: E402
from tests.fixtures import in_project, make_tiny_project, run_stage  # noqa: E402

pytestmark = pytest.mark.timeout(600)


class Stop(Exception):
    """Leaves a stage's run block without landing anything."""


def test_a_node_describes_itself_as_the_server_does_inside_its_stage(tmp_path, monkeypatch):
    """The node computes its facts in its own process, outside any stage run, where torch
    starts on every core; the server inside ``ctx.run()``, on the stage's threads and
    precision. Both must come out equal (they said "threads 2" against "threads 1,
    precision bf16", refusing every node)."""
    root = make_tiny_project(tmp_path / "p", git=False)
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    monkeypatch.delenv("FEDSSL_THREADS", raising=False)
    threads, policy = torch.get_num_threads(), precision.active()
    node = NodeFederation()
    context = SimpleNamespace(
        run_config={"step": "pretrain", "experiment": "tiny_simclr"},
        node_config={"partition-id": 0, "root": str(root)},
    )
    try:
        with in_project(root) as planned_stage:
            planned = planned_stage("pretrain", "tiny_simclr")
            for name in planned.spec.upstream:
                run_stage(type(planned)(planned.dag, name), upstream=True)
            torch.set_num_threads(2)  # a fresh process's default on a 2-core machine
            node(context)
            torch.set_num_threads(2)
            ctx = StageContext("pretrain", "tiny_simclr")
            with pytest.raises(Stop):
                with ctx.run():
                    server = agreement(ctx)
                    raise Stop
    finally:
        torch.set_num_threads(threads)
        precision.use(policy)
    assert node.facts == server
    assert server["threads"] == "1" and server["device"] == "cpu" and "precision" in server
    assert "partition__tiny_dir05_m3" in server and "code fedssl/stage/base.py" in server
    assert node.who(context)["client"] == 0


def test_a_node_that_differs_is_told_each_field_and_both_values():
    server = {"params": "a" * 64, "threads": "1", "partition__p": "d" * 64, "code x.py": "c"}
    compare(server, {"client": 1, **server}, 1)
    node = {**server, "threads": "2", "partition__p": "e" * 64}
    with pytest.raises(StageFailed) as e:
        compare(server, node, 1)
    assert str(e.value) == (
        f"the SuperNode of client 1 differs from the server in partition__p (node {'e' * 12}, "
        f"server {'d' * 12}), threads (node 2, server 1): set FEDSSL_THREADS alike on every "
        "machine; delete the node's copy of that output so it derives it again"
    )
    with pytest.raises(StageFailed, match=r"in code x.py \(node none, server c\): check out"):
        compare(server, {k: v for k, v in server.items() if k != "code x.py"}, 1)


class SilentGrid:
    """Two nodes; node 2 (client 1) does not answer messages of type ``silent_in`` (its task
    was taken by another process on its machine). Like Flower's grid it returns what came
    within ``timeout``."""

    def __init__(self, silent_in: str):
        self.timeouts, self.silent_in = [], silent_in

    def get_node_ids(self):
        return [1, 2]

    def send_and_receive(self, messages, timeout=None):
        if timeout is None:
            raise AssertionError("awaited with no deadline: Flower would wait for ever")
        self.timeouts.append(timeout)
        kinds = {m.metadata.message_type for m in messages}
        nodes = [m.metadata.dst_node_id for m in messages]
        answering = nodes[:1] if kinds == {self.silent_in} else nodes
        return [self.reply(n) for n in answering]

    @staticmethod
    def reply(node):
        who = {"who": {"client": node - 1}}
        meta = SimpleNamespace(src_node_id=node)
        return SimpleNamespace(has_error=lambda: False, metadata=meta, content=who)


def test_a_reply_that_never_comes_ends_the_run_at_its_deadline(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    from fedssl.flower.rounds import Task

    for field in ("_task_id", "_run_id", "_node_id"):  # as in a ServerApp's process
        monkeypatch.setattr(TaskIdentity, field, 1)

    grid = SilentGrid("train")
    exchange = GridExchange(grid, clients=2, wait=1, reply_wait=5)
    assert exchange.node_of == {0: 1, 1: 2}
    tasks = [Task(c, [0, 1], 0, 0.1, {"w": torch.zeros(2)}) for c in (0, 1)]
    with pytest.raises(StageFailed) as e:
        exchange(tasks)
    assert grid.timeouts == [5, 5]
    assert str(e.value) == (
        "the SuperNode of client 1 failed in round 1: no reply within 5 s (reply-wait; its "
        "task may have been taken by another process on its machine) (restart it and submit "
        "the run again: it resumes from its last checkpoint)"
    )
    with pytest.raises(StageFailed, match=r"^the SuperNode of client 1 \(node 2\) failed answe"):
        GridExchange(SilentGrid("query"), clients=2, wait=1, reply_wait=5)
