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


def outward_address() -> str:
    """This machine's address on its network (what another machine would dial), or
    127.0.0.1 where it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Deployment:
    """The SuperLink bound on every interface (as for other machines) and dialled at this
    machine's network address, which its certificate names."""

    def __init__(self, folder: Path, nodes: int):
        self.folder = Path(folder)
        self.port = free_port()
        self.address = outward_address()
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

    def start_superlink(self, root: Path) -> None:
        self.start("superlink", "superlink", "--credentials", self.credentials, "--root", root,
                   "--host", "0.0.0.0", "--port", self.port)  # fmt: skip
        wait_for(lambda: "Uvicorn running on https" in self.log("superlink"), 120, "SuperLink")
        self.call("connect", "--credentials", self.credentials, "--superlink", self.superlink)

    def register(self, node: int) -> str:
        return self.call("flwr", "supernode", "register", self.credentials / f"node-{node}.pub",
                         "fedssl").stdout  # fmt: skip

    def start_node(self, client: int, root: Path, credentials: Path | None = None) -> str:
        name = f"node{client}"
        self.start(name, "supernode", "--credentials", credentials or self.credentials,
                   "--client", client, "--root", root, "--superlink", self.superlink,
                   "--port", free_port())  # fmt: skip
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
