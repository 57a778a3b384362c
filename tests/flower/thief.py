"""A process on a SuperNode's machine that takes the node's next ClientApp task and never
answers it, keeping it claimed with heartbeats: what any local process can do through the
node's Runtime API, which Flower serves on loopback without authentication in its default
(subprocess) isolation. ``python -m tests.flower.thief PORT SECONDS``: polls the node's
Runtime API at 127.0.0.1:PORT for at most SECONDS, prints "took task N" once it has one."""

from __future__ import annotations

import sys
import time

from flwr.proto.runtime_pb2 import AcquireTaskRequest, SendTaskHeartbeatRequest
from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
from flwr.supercore.interceptors.http.runtime_token import RuntimeTokenHttpInterceptor
from flwr.supercore.runtime import RuntimeHttpClient

POLL = 0.05  # seconds: the node's own executor polls once a second, so this one wins


def runtime_api(port: int, *interceptors) -> RuntimeHttpClient:
    version = RuntimeVersionHttpInterceptor(component_name="SuperExec")
    return RuntimeHttpClient.from_server_address(
        f"127.0.0.1:{port}", insecure=True, root_certificates=None,
        interceptors=[version, *interceptors],
    )  # fmt: skip


def take(port: int, deadline: float) -> str | None:
    """The token of the first ClientApp task the node offers before ``deadline``."""
    api = runtime_api(port)
    while time.monotonic() < deadline:
        try:
            got = api.AcquireTask(AcquireTaskRequest(supported_task_types=["flwr-clientapp"]))
        except Exception:  # noqa: BLE001 - the node is not up yet
            got = None
        if got is not None and got.HasField("task") and got.token:
            print(f"took task {got.task.task_id}", flush=True)
            return got.token
        time.sleep(POLL)
    return None


def main() -> None:
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    deadline = time.monotonic() + seconds
    token = take(port, deadline)
    if token is None:
        sys.exit("no task to take")
    holder = runtime_api(port, RuntimeTokenHttpInterceptor(token))
    while time.monotonic() < deadline:
        holder.SendTaskHeartbeat(SendTaskHeartbeatRequest())
        time.sleep(2)


if __name__ == "__main__":
    main()
