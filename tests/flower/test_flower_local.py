"""A real Flower deployment on localhost, set up as docs/how-to/flower-two-machines.md sets up
two machines (tests/flower/deployment.py): a SuperLink with TLS, SuperNode authentication and a
Control API token, bound and dialled on 127.0.0.1, and two SuperNodes, each with its own
project root. FedSimCLR's pretraining of a tiny two-client project submitted with `flwr run`
writes the very files the engine's stage writes, byte for byte (round losses included); nodes
and callers without the deployment's credentials are refused; too few nodes, a node lost
mid-run and a task another local process took end the run with one line and a non-zero exit.
Opt-in (FEDSSL_FLOWER_TEST=1, with `.[flower]` installed): `make test-flower` runs it all,
CI (`make test-flower-deploy`) all but the two refusal tests."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedssl.flower.__main__ import APP
from tests.fixtures import REPO, make_tiny_project, opt_in
from tests.flower.deployment import Deployment, wait_for

pytestmark = opt_in(
    "flower", "FEDSSL_FLOWER_TEST", "make test-flower (needs pip install -e '.[flower]')", 1800
)
STAGE = "pretrain__tiny_simclr2"
RUN = "experiment='tiny_simclr2'"


def two_client_project(root: Path) -> Path:
    make_tiny_project(root, git=False)
    params = root / "params"
    part = (params / "partitions" / "tiny_dir05_m3.yaml").read_text()
    (params / "partitions" / "tiny_dir05_m2.yaml").write_text(
        part.replace("num_clients: 3", "num_clients: 2")
    )
    exp = (params / "experiments" / "tiny_simclr.yaml").read_text()
    (params / "experiments" / "tiny_simclr2.yaml").write_text(
        exp.replace("partition: tiny_dir05_m3", "partition: tiny_dir05_m2")
    )
    return root


def outputs(root: Path) -> dict[str, bytes]:
    folders = [
        root / "artifacts/experiments/tiny_simclr2/pretrain",
        root / "results/experiments/tiny_simclr2",
    ]
    return {str(p.relative_to(root)): p.read_bytes() for d in folders for p in sorted(d.glob("*"))}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The SuperLink on the server's project (its data, partition and the simulator stage's
    outputs already there), both node keys registered; no node started."""
    folder = tmp_path_factory.mktemp("flower")
    server = two_client_project(folder / "server")
    d = Deployment(folder, nodes=2)
    run_in = lambda *cmd: subprocess.run(cmd, cwd=server, env=d.env, check=True)  # noqa: E731
    run_in(sys.executable, "-m", "stages.prepare_data", "tiny")
    run_in(sys.executable, "-m", "stages.partition", "tiny_dir05_m2")
    run_in(sys.executable, "-m", "stages.method", "pretrain", "tiny_simclr2")
    d.expected = outputs(server)
    d.server = server
    d.start_superlink(server)
    for k in (0, 1):
        assert "registered successfully" in d.register(k)
    yield d
    d.close()


def forget_outputs(root: Path) -> None:
    for d in ("artifacts/experiments/tiny_simclr2", "results/experiments/tiny_simclr2"):
        shutil.rmtree(root / d, ignore_errors=True)
    (root / "artifacts/.resume" / f"{STAGE}.pt").unlink(missing_ok=True)


def connected(d: Deployment, name: str) -> bool:
    return "SuperNode ID:" in d.log(name)


def test_callers_without_the_credentials_are_refused(deployment):
    """A caller with the CA certificate but not the token (its own FLWR_HOME: the token lives
    in the deployment owner's, readable by that user only), and one without TLS."""
    d = deployment
    stranger = d.folder / "stranger_home"
    stranger.mkdir()
    (stranger / "config.toml").write_text(
        f'[superlink]\ndefault = "notoken"\n\n[superlink.notoken]\naddress = "{d.superlink}"\n'
        f'root-certificates = "{d.credentials / "ca.crt"}"\n'
        f'\n[superlink.plain]\naddress = "{d.superlink}"\ninsecure = true\n'
    )
    as_stranger = {**d.env, "FLWR_HOME": str(stranger)}

    def flwr(*args) -> str:
        cmd = ["flwr", *map(str, args)]
        proc = subprocess.run(cmd, env=as_stranger, capture_output=True, text=True, timeout=600)
        return " ".join((proc.stdout + proc.stderr).split())

    started = time.monotonic()
    assert "Authentication failed" in (out := flwr("ls", "notoken")), out
    assert "Authentication failed" in (out := flwr("run", APP, "notoken")), out
    seconds = time.monotonic() - started
    assert "Connection to the SuperLink is unavailable" in (out := flwr("ls", "plain")), out
    assert '"runs": []' in d.call("flwr", "ls", "fedssl", "--format", "json").stdout
    print(f"token-less flwr ls and flwr run refused in {seconds:.1f} s")
    rogue = d.folder / "rogue"  # a node key the SuperLink was never told of
    subprocess.run(
        [sys.executable, "-c", "from fedssl.flower.credentials import _write_node_key as w; "
         f"from pathlib import Path; Path('{rogue}').mkdir(); w(Path('{rogue}'), 0)"],
        env=d.env, check=True,
    )  # fmt: skip
    shutil.copy(d.credentials / "ca.crt", rogue / "ca.crt")
    started = time.monotonic()
    node = d.start_node(0, d.server, credentials=rogue)
    assert d.procs[node].wait(timeout=300) != 0
    print(f"unregistered SuperNode refused in {time.monotonic() - started:.1f} s")
    log = d.log(node)
    d.procs.pop(node)
    assert "Failed to activate SuperNode" in log and "SuperNode ID:" not in log


def test_a_step_runs_through_two_nodes_with_their_own_roots(deployment):
    """Node roots with neither data nor partition: each node derives them from the params."""
    d = deployment
    forget_outputs(d.server)
    roots = [two_client_project(d.folder / f"node{k}_root") for k in (0, 1)]
    names = [d.start_node(k, root) for k, root in enumerate(roots)]
    try:
        started = time.monotonic()
        proc = d.submit(RUN)
        print(f"run through the deployment: {time.monotonic() - started:.0f} s")
    finally:
        for name in names:
            d.stop(name)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "round 2/2" in proc.stdout
    got = outputs(d.server)
    assert got.keys() == d.expected.keys() and len(got) == 4
    for name, content in d.expected.items():
        assert got[name] == content, name
    record = (d.server / "artifacts/.runs" / f"{STAGE}.json").read_text()
    assert "flower deployment, 2 SuperNodes" in record
    for root in roots:  # derived on the node, equal to the server's
        assert (root / "artifacts/partitions/tiny_dir05_m2/meta.json").is_file()


def test_too_few_nodes_end_the_run_at_once(deployment):
    d = deployment
    forget_outputs(d.server)
    name = d.start_node(0, d.server)
    try:
        wait_for(lambda: connected(d, name), 300, "SuperNode 0")
        started = time.monotonic()
        proc = d.submit(RUN + " node-wait=5")
        seconds = time.monotonic() - started
    finally:
        d.stop(name)
    print(f"1 of 2 nodes: exit {proc.returncode} after {seconds:.0f} s")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "finished:failed" in last and "1 of 2 SuperNodes connected within 5 s" in last, last


def test_a_task_another_local_process_took_ends_the_run_at_its_deadline(deployment):
    """Any process on node 1's machine takes its ClientApp task through the node's Runtime API
    and holds it: the run ends when the reply is ``reply-wait`` seconds late, naming client 1
    (it used to wait for ever)."""
    d = deployment
    forget_outputs(d.server)
    names = [d.start_node(k, d.server) for k in (0, 1)]
    thief = subprocess.Popen(
        [sys.executable, "-m", "tests.flower.thief", str(d.ports["node1"]), "600"],
        env=d.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        started = time.monotonic()
        proc = d.submit(RUN + " reply-wait=30")
        print(f"task taken: run ended after {time.monotonic() - started:.0f} s")
    finally:
        for name in names:
            d.stop(name)
        thief.kill()
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    took = thief.communicate()[0]
    assert proc.returncode == 1 and "took task" in took, f"{last}\nthief: {took}"
    assert "finished:failed" in last, last
    assert re.search(
        r"the SuperNode of client 1 (\(node \d+\) )?failed (answering which client it is|in "
        r"round \d): no reply "
        r"within 30 s \(reply-wait; its task may have been taken by another process",
        last,
    ), last


def test_a_node_lost_mid_run_ends_the_run_with_one_line(deployment):
    """Its reply never comes: the run ends at ``reply-wait`` (30 s here) or when Flower has
    missed two of its heartbeats (about 60 s), whichever comes first. Last: the SuperLink lists
    the dead node until then, so a run started at once would count it."""
    d = deployment
    forget_outputs(d.server)
    names = [d.start_node(k, d.server) for k in (0, 1)]
    out = d.folder / "lost.out"
    config = RUN + " reply-wait=30"
    with open(out, "w") as f:
        submit = subprocess.Popen(
            [sys.executable, "-m", "fedssl.flower", "submit", "--run-config", config],
            env=d.env, cwd=d.folder, stdout=f, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: "round 1/2" in out.read_text(), 900, "round 1")
        d.stop(names[1], signal.SIGKILL)
        killed = time.monotonic()
        assert submit.wait(timeout=600) == 1
        print(f"node lost: run ended {time.monotonic() - killed:.0f} s after the kill")
    finally:
        d.stop(names[0])
        if submit.poll() is None:
            submit.kill()
    last = out.read_text().strip().splitlines()[-1]
    assert "finished:failed" in last and "the SuperNode of client 1 failed in round 2" in last
