"""A method's federation as a Flower ``ServerApp`` and ``ClientApp``.

The server app runs the engine (the method's strategy: sampling, download, aggregation, server
step; the checkpoint, round log and ledger) with :class:`~fedssl.flower.rounds.RemoteRounds` as
its trainer, whose exchange is Flower messages through the ``Grid``. Each client app builds the
method's federation from the same params and partition and runs
:func:`~fedssl.flower.rounds.client_round` for the client its SuperNode is (its node config's
``partition-id``), keeping its memory in the node's ``Context.state`` between rounds.

Messages: the server first asks every node which client it is (``query``), then per round
sends ``train`` with ``received`` (an ``ArrayRecord``: the download) and ``task`` (a
``ConfigRecord``: client, cohort, round, lr); the reply holds ``upload`` and ``result`` (loss,
samples). Tensors cross as NumPy arrays: every dtype the models use round-trips exactly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedssl.fl.cohort import Tensors
from fedssl.flower.rounds import Client, ClientMemory, RemoteRounds, Result, Task
from fedssl.stage.runtime import StageFailed

PARTITION_ID = "partition-id"  # Flower's node config key for which client a SuperNode is


def to_record(tensors: Tensors) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in tensors.items()})


def from_record(record: ArrayRecord) -> Tensors:
    return {k: torch.from_numpy(a.numpy().copy()) for k, a in record.items()}


# ---------------------------------------------------------------------------- server side
class GridExchange:
    """Sends a round's tasks to the SuperNodes that are those clients; returns their results.

    At start it waits up to ``wait`` seconds for ``clients`` nodes and asks each which client
    it is; with ``facts`` it hands each node's answer to ``compare(facts, answer, client)``,
    which raises where the node's params or data differ. Every reply is awaited at most
    ``reply_wait`` seconds (None: for ever): a node's task can be taken by another process
    on its machine, which may never answer. Fewer nodes, a client no node is, a node lost
    mid-run or a reply past its deadline stop the run with a
    :class:`~fedssl.stage.runtime.StageFailed` of one line."""

    def __init__(
        self,
        grid: Grid,
        clients: int,
        wait: float = 600.0,
        facts=None,
        compare=None,
        reply_wait: float | None = None,
    ):
        self.grid, self.clients, self.reply_wait = grid, clients, reply_wait
        self.facts, self.compare = facts or {}, compare
        self.node_of = self.find_clients(clients, wait)

    def find_clients(self, clients: int, wait: float) -> dict[int, int]:
        """client -> node id, from each node's answer to a ``query``."""
        deadline = time.monotonic() + wait
        while len(nodes := list(self.grid.get_node_ids())) < clients:
            if time.monotonic() > deadline:
                raise StageFailed(
                    f"{len(nodes)} of {clients} SuperNodes connected within {wait:.0f} s: the "
                    f"experiment has {clients} clients, start one SuperNode per client "
                    f"({PARTITION_ID} 0 to {clients - 1})"
                )
            time.sleep(0.5)
        asks = [Message(RecordDict(), dst_node_id=n, message_type="query") for n in nodes]
        node_of = {}
        for node, content in self.replies(asks, "answering which client it is").items():
            answer = content["who"]
            client = int(answer["client"])
            if client in node_of:
                raise StageFailed(f"two SuperNodes say they are client {client} ({PARTITION_ID})")
            if self.compare is not None:
                self.compare(self.facts, dict(answer), client)
            node_of[client] = node
        missing = sorted(set(range(clients)) - set(node_of))
        if missing:
            raise StageFailed(
                f"no SuperNode has {PARTITION_ID} {missing} (the connected ones are clients "
                f"{sorted(node_of)})"
            )
        return node_of

    def replies(self, messages: list[Message], doing: str) -> dict[int, RecordDict]:
        """Each destination node's reply content; a node that failed or was lost (Flower
        answers for it with an error) stops the run with one line naming it."""
        got, errors = {}, []
        for reply in self.grid.send_and_receive(messages, timeout=self.reply_wait):
            if reply.has_error():
                errors.append(reply.error.reason.splitlines()[0])
            else:
                got[reply.metadata.src_node_id] = reply.content
        lost = [m.metadata.dst_node_id for m in messages if m.metadata.dst_node_id not in got]
        if lost:
            why = errors[0] if errors else self.silence()
            raise StageFailed(
                f"the SuperNode of {self.named(lost, got)} failed {doing}: {why} (restart it "
                "and submit the run again: it resumes from its last checkpoint)"
            )
        return got

    def named(self, lost: list[int], got: dict[int, RecordDict]) -> str:
        """The clients of nodes ``lost``; before every node said which client it is, the
        clients no answer in ``got`` accounts for."""
        clients = {n: c for c, n in getattr(self, "node_of", {}).items()}
        if clients:
            return ", ".join(f"client {clients[n]}" if n in clients else f"node {n}" for n in lost)
        answered = {int(content["who"]["client"]) for content in got.values()}
        unheard = sorted(set(range(self.clients)) - answered)
        nodes = ", ".join(map(str, lost))
        if len(unheard) == len(lost) == 1:
            return f"client {unheard[0]} (node {nodes})"
        return f"node {nodes} (clients {', '.join(map(str, unheard))} unheard of)"

    def silence(self) -> str:
        """Why a node that sent neither a reply nor an error is given up on."""
        if self.reply_wait is None:
            return "no reply"
        return (
            f"no reply within {self.reply_wait:.0f} s (reply-wait; its task may have been "
            "taken by another process on its machine)"
        )

    def __call__(self, tasks: list[Task]) -> list[Result]:
        messages = [
            Message(
                RecordDict(
                    {
                        "received": to_record(t.received),
                        "task": ConfigRecord(
                            {"client": t.client, "cohort": t.cohort, "round": t.round, "lr": t.lr}
                        ),
                    }
                ),
                dst_node_id=self.node_of[t.client],
                message_type="train",
                group_id=str(t.round),
            )
            for t in tasks
        ]
        by_node = self.replies(messages, f"in round {tasks[0].round + 1}")  # 1-based, as logged
        return [result_of(by_node[self.node_of[t.client]]) for t in tasks]


def result_of(content: RecordDict) -> Result:
    kept = content.get("kept")
    return Result(
        from_record(content["upload"]),
        float(content["result"]["loss"]),
        int(content["result"]["images"]),
        None if kept is None else from_record(kept),
    )


def server_app(run: Callable[[RemoteRounds], None], clients: int) -> ServerApp:
    """A ``ServerApp`` whose main calls ``run(trainer)``: ``run`` drives the method's
    federation (the stage's step, or a test's) with ``trainer`` carrying its rounds to the
    ``clients`` SuperNodes. An error in ``run`` is kept in ``app.error`` (Flower logs and
    swallows it)."""
    app = ServerApp()
    app.error = None

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            run(RemoteRounds(GridExchange(grid, clients)))
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            app.error = e
            raise

    return app


# ---------------------------------------------------------------------------- client side
def save_memory(memory: ClientMemory, state: RecordDict) -> None:
    """Into the node's ``Context.state``: the kept tensors as arrays, the memo as JSON (it
    holds numbers and strings; nothing on the node is ever unpickled)."""
    if memory.kept is not None:
        state["kept"] = to_record(memory.kept)
    state["memo"] = ConfigRecord({"json": json.dumps(memory.memo)})


def load_memory(state: RecordDict) -> ClientMemory:
    kept = state.get("kept")
    memo = state.get("memo")
    return ClientMemory(
        None if kept is None else from_record(kept),
        {} if memo is None else json.loads(memo["json"], object_hook=_int_keys),
    )


def _int_keys(d: dict) -> dict:
    """JSON keys are strings: the memo's per-client records are keyed by client number."""
    return {int(k) if k.lstrip("-").isdigit() else k: v for k, v in d.items()}


def client_app(
    federation: Callable[[Context], tuple],
    who: Callable[[Context], ConfigRecord] | None = None,
) -> ClientApp:
    """A ``ClientApp`` that trains its client's part of each round of the method's federation:
    ``federation(context)`` returns (model, Federation), built once per process from the same
    params and partition (the run's config says which). It answers the server's ``query``
    once built, with ``who(context)`` (default: its client, the node's ``partition-id``)."""
    app = ClientApp()
    built: list[Client] = []

    def client(context: Context) -> Client:
        if not built:
            built.append(Client(*federation(context)))
        return built[0]

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        client(context)
        if who is not None:
            answer = who(context)
        else:
            answer = ConfigRecord({"client": int(context.node_config[PARTITION_ID])})
        return Message(RecordDict({"who": answer}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        me = int(context.node_config[PARTITION_ID])
        cfg = msg.content["task"]
        if int(cfg["client"]) != me:
            raise RuntimeError(f"SuperNode of client {me} got client {cfg['client']}'s task")
        task = Task(
            me,
            [int(c) for c in cfg["cohort"]],
            int(cfg["round"]),
            float(cfg["lr"]),
            from_record(msg.content["received"]),
        )
        result, memory = client(context).round(task, load_memory(context.state))
        save_memory(memory, context.state)
        reply = {
            "upload": to_record(result.upload),
            "result": MetricRecord({"loss": result.loss, "images": result.images}),
        }
        if result.kept is not None:
            reply["kept"] = to_record(result.kept)
        return Message(RecordDict(reply), reply_to=msg)

    return app


def simulate(
    run: Callable[[RemoteRounds], None],
    federation: Callable[[Context], tuple],
    clients: int,
    cpus: int = 1,
) -> None:
    """Run ``run`` as a ``ServerApp`` in Flower's simulation engine, with ``clients``
    SuperNodes running ``client_app(federation)`` (``cpus`` Ray actors at once)."""
    from flwr.simulation import run_simulation

    server = server_app(run, clients)
    gpus = 1.0 / clients if torch.cuda.is_available() else 0.0  # the clients share the GPU
    run_simulation(
        server,
        client_app(federation),
        num_supernodes=clients,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": gpus},
            "init_args": {"num_cpus": cpus, "include_dashboard": False},
        },
    )
    if server.error is not None:
        raise server.error
