"""A Flower deployment on localhost run as docs/how-to/flower-two-machines.md sets up two
machines: the same `python -m fedssl.flower` commands, each party in its own process, the
SuperLink and each SuperNode with its own project root; `flwr`'s own state (its connection
and token) in a private FLWR_HOME. Stops every process it started, by its id."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.fixtures import REPO

FLOWER = [sys.executable, "-m", "fedssl.flower"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Deployment:
    """The SuperLink bound on the loopback interface only and dialled there (the how-to's
    default ``--host``): no packet of the test leaves this machine."""

    def __init__(self, folder: Path, nodes: int):
        self.folder = Path(folder)
        self.port = free_port()
        self.address = "127.0.0.1"
        self.superlink = f"{self.address}:{self.port}"
        self.credentials = self.folder / "credentials"
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.folder / "flwr_home"),
            "PYTHONPATH": str(REPO),
            "FEDSSL_DEVICE": "cpu",
            "FEDSSL_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.call("credentials", self.credentials, "--host", self.address, "--nodes", nodes)

    def call(self, *args, check=True) -> subprocess.CompletedProcess:
        """``python -m fedssl.flower ARGS`` (or ``flwr ARGS`` when the first is "flwr")."""
        cmd = ["flwr", *args[1:]] if args[0] == "flwr" else [*FLOWER, *args]
        return subprocess.run(
            [str(a) for a in cmd],
            env=self.env,
            cwd=self.folder,
            capture_output=True,
            text=True,
            check=check,
            timeout=1500,
        )

    def start(self, name: str, *args) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(
            [*FLOWER, *map(str, args)],
            env=self.env,
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stopped with its helpers
        )
        return self.procs[name]

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text()

    def wait_up(self, name: str, line: str, seconds: float) -> None:
        """Until ``line`` is in process ``name``'s log; one that exits first fails at once,
        with its log's last lines."""

        def up() -> bool:
            if self.procs[name].poll() is not None:
                tail = "\n".join(self.log(name).splitlines()[-8:])
                raise RuntimeError(f"{name} exited ({self.procs[name].returncode}):\n{tail}")
            return line in self.log(name)

        wait_for(up, seconds, name)

    def start_superlink(self, root: Path) -> None:
        self.start("superlink", "superlink", "--credentials", self.credentials, "--root", root,
                   "--host", self.address, "--port", self.port)  # fmt: skip
        self.wait_up("superlink", "Uvicorn running on https", 120)
        self.call("connect", "--credentials", self.credentials, "--superlink", self.superlink)

    def register(self, node: int) -> str:
        return self.call("flwr", "supernode", "register", self.credentials / f"node-{node}.pub",
                         "fedssl").stdout  # fmt: skip

    def start_node(self, client: int, root: Path, credentials: Path | None = None) -> str:
        name = f"node{client}"
        self.ports[name] = free_port()  # its Runtime API, for the processes it starts
        self.start(name, "supernode", "--credentials", credentials or self.credentials,
                   "--client", client, "--root", root, "--superlink", self.superlink,
                   "--port", self.ports[name])  # fmt: skip
        return name

    def submit(self, run_config: str) -> subprocess.CompletedProcess:
        return self.call("submit", "--run-config", run_config, check=False)

    def stop(self, name: str, sig=signal.SIGTERM) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not up within {seconds:.0f} s")
        time.sleep(0.5)
