"""Nothing is lost on bad input or on a kill: invalid params (fuzzed) are rejected before any
compute with the file and field named and leave every artifact as it was, through both front
ends; a killed long stage resumes to the very result of an uninterrupted run; a diverged loss
stops with a clear error keeping the last good checkpoint; Ctrl-C prints no traceback; no
artifact is loaded by unpickling arbitrary objects."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedssl import params as P
from tests.fixtures import TINY_MFCL_EXPERIMENT, make_tiny_project, run, run_and_record

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The default pipeline computed and recorded as the front ends leave it (in this process:
    their own round trips are test_frontends'), so that a refused run has artifacts and results
    to leave alone."""
    root = make_tiny_project(tmp_path_factory.mktemp("safety"))
    run_and_record(root, ["default"])
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every artifact and result, by content (not the bookkeeping: receipts, logs, run records,
    the planner's caches)."""
    files = [p for d in ("artifacts", "results") for p in (root / d).rglob("*") if p.is_file()]
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in files
        if not {".receipts", "logs", ".runs", ".cache"} & set(p.parts)
    }


# ------------------------------------------------------------------ invalid params (fuzzed)
EXPERIMENT = "params/experiments/tiny_simclr.yaml"
PARTITION = "params/partitions/tiny_dir05_m3.yaml"


def leaves(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from leaves(v, (*prefix, k))
        else:
            yield (*prefix, k), v


def set_at(tree, path, value):
    for k in path[:-1]:
        tree = tree[k]
    tree[path[-1]] = value


@st.composite
def broken(draw, base: dict, file: str):
    """A copy of ``base`` with one thing wrong, and the word the error must name."""
    doc = yaml.safe_load(yaml.safe_dump(base))
    paths = [p for p, v in leaves(doc) if not isinstance(v, (list, str)) or p[-1] == "arch"]
    path = draw(st.sampled_from(paths))
    kind = draw(st.sampled_from(["unknown key", "wrong type", "out of range"]))
    if kind == "unknown key":
        name = draw(st.from_regex(r"[a-z]{3,8}_typo", fullmatch=True))
        set_at(doc, (*path[:-1], name), 1)
        return doc, name
    old = dict(leaves(doc))[path]
    unbounded = path[-1] == "seed"  # any integer is a seed
    if (
        kind == "wrong type"
        or unbounded
        or isinstance(old, bool)
        or not isinstance(old, (int, float))
    ):
        value = draw(st.sampled_from([["a", "list"], {"a": "map"}, "not a number"]))
        if isinstance(old, str):  # a string field: the Literal choices reject other words
            value = draw(st.sampled_from(["nonsense", ["a"], {"a": 1}]))
    else:
        value = draw(st.sampled_from([-1, -0.5, 10**9 if path[-1] in ("num_clients",) else -7]))
    set_at(doc, path, value)
    return doc, path[-1]


def rejected(root: Path, file: str, doc: dict) -> str:
    """Write ``doc`` over ``file``, validate the default pipeline, restore: the error text."""
    from fedssl.plan.dag import Dag

    path = root / file
    good = path.read_text()
    cwd = os.getcwd()
    try:
        path.write_text(yaml.safe_dump(doc))
        os.chdir(root)
        with pytest.raises(P.ParamsError) as err:
            Dag("default")
        return str(err.value)
    finally:
        os.chdir(cwd)
        path.write_text(good)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_invalid_experiments_are_rejected_naming_file_and_field(project, data):
    base = yaml.safe_load((project / EXPERIMENT).read_text())
    doc, field = data.draw(broken(base, EXPERIMENT))
    if doc == base:
        return
    message = rejected(project, EXPERIMENT, doc)
    assert "tiny_simclr.yaml" in message and field in message, message


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_invalid_partitions_are_rejected_naming_file_and_field(project, data):
    base = yaml.safe_load((project / PARTITION).read_text())
    doc, field = data.draw(broken(base, PARTITION))
    if doc == base:
        return
    message = rejected(project, PARTITION, doc)
    assert "tiny_dir05_m3.yaml" in message and field in message, message


@pytest.mark.parametrize(
    "file, edit, named",
    [
        (PARTITION, ("num_clients: 3", "num_clients: 5000"), "num_clients"),  # more than samples
        ("params/pipelines.yaml", ("tiny_pixels]", "tiny_pixels, tiny_nope]"), "tiny_nope"),
        pytest.param(
            "params/datasets/tiny.yaml",
            ("data_root: raw", "data_root: nowhere"),
            "data set not",
            marks=pytest.mark.slow,  # test_frontends' bad edit moves the data set in both
        ),
    ],
)
def test_inconsistent_params_are_rejected_by_both_front_ends_losing_nothing(
    project, file, edit, named
):
    path = project / file
    good = path.read_text()
    before = snapshot(project)
    try:
        path.write_text(good.replace(*edit))
        smk = run(["snakemake", "--cores", "2"], project, check=False)
        dvc = run(["dvc", "repro"], project, check=False)
        for proc in (smk, dvc):
            assert proc.returncode != 0
            assert named in proc.stdout + proc.stderr
        assert snapshot(project) == before  # every artifact and result byte-identical
    finally:
        path.write_text(good)


@pytest.mark.parametrize(
    "mutation",
    [
        "unknown key",  # the fuzzed tests above cover every kind in process; the front ends
        pytest.param("wrong type", marks=pytest.mark.slow),  # pass the message on alike
        pytest.param("out of range", marks=pytest.mark.slow),
    ],
)
def test_fuzzed_params_through_both_front_ends_touch_no_artifact(project, mutation):
    path = project / EXPERIMENT
    good = path.read_text()
    doc = yaml.safe_load(good)
    field = {"unknown key": "tmperature", "wrong type": "rounds", "out of range": "lr"}[mutation]
    doc["method"][field] = {"unknown key": 0.5, "wrong type": "two", "out of range": -1}[mutation]
    before = snapshot(project)
    try:
        path.write_text(yaml.safe_dump(doc))
        for cmd in (["snakemake", "--cores", "2"], ["dvc", "repro"]):
            proc = run(cmd, project, check=False)
            assert proc.returncode != 0 and field in proc.stdout + proc.stderr
            assert "tiny_simclr.yaml" in proc.stdout + proc.stderr
        assert snapshot(project) == before
    finally:
        path.write_text(good)


# ------------------------------------------------------------------ kill and resume
LONG = {
    "tiny_simclr_long": "extends: tiny_simclr\ntitle: long\nmethod: {federation: {rounds: 12}}\n",
    "tiny_mfcl_long": TINY_MFCL_EXPERIMENT.format(norm="gn", secure="false")
    .replace("rounds: 2,", "rounds: 12,")
    .replace("epochs: 2,", "epochs: 12,"),
}


@pytest.fixture(scope="module")
def long_project(tmp_path_factory):
    root = make_tiny_project(tmp_path_factory.mktemp("resume"), git=False)
    for name, body in LONG.items():
        (root / f"params/experiments/{name}.yaml").write_text(body)
    for cmd in (["prepare_data", "tiny"], ["partition", "tiny_dir05_m3"]):
        run(["python", "-m", f"stages.{cmd[0]}", cmd[1]], root)
    return root


def stage_cmd(kind: str, exp: str) -> list[str]:
    # one thread everywhere: a result must not depend on how many threads each part used
    return ["env", "FEDSSL_THREADS=1", "python", "-m", "stages.method", kind, exp]


def weights(path: Path) -> dict:
    return torch.load(path, weights_only=True)["model"]


def kill_mid_way(root: Path, cmd: list[str], resume: Path, sig=signal.SIGKILL):
    """Start a stage, wait for its first checkpoint, kill it: returns its stderr."""
    proc = subprocess.Popen(
        cmd[2:],
        cwd=root,
        # SIGINT handled as from a terminal even when the tests run in the background (which
        # ignores it, and Python started so never raises KeyboardInterrupt)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FEDSSL_THREADS": "1"},
    )
    deadline = time.time() + 120
    while not resume.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the stage finished before it could be killed"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize(
    "kind, exp",
    [
        ("pretrain", "tiny_simclr_long"),
        ("pretrain", "tiny_mfcl_long"),
        ("rserver", "tiny_mfcl_long"),
    ],
)
def test_a_killed_stage_resumes_to_the_uninterrupted_result(long_project, kind, exp):
    root = long_project
    if kind == "rserver":
        for step in ("pretrain", "export"):
            if not (root / f"artifacts/experiments/{exp}/{step}").exists():
                run(stage_cmd(step, exp), root)
    out = root / f"artifacts/experiments/{exp}/{kind}"
    resume = root / f"artifacts/.resume/{kind}__{exp}.pt"
    run(stage_cmd(kind, exp), root)
    uninterrupted = weights(out / "model.pt")
    code, _ = kill_mid_way(root, stage_cmd(kind, exp), resume)
    assert code == -signal.SIGKILL
    assert not list(root.glob(f"artifacts/experiments/{exp}/{kind}.partial*/model.pt"))
    assert weights(out / "model.pt").keys() == uninterrupted.keys()  # the old output stays
    resumed = run(stage_cmd(kind, exp), root)
    assert re.search(r"resuming from (round|epoch) [1-9]", resumed.stdout), resumed.stdout
    for k, v in weights(out / "model.pt").items():
        assert torch.equal(v, uninterrupted[k]), k
    assert not resume.exists()


def test_ctrl_c_stops_cleanly_and_resumes(long_project):
    resume = long_project / "artifacts/.resume/pretrain__tiny_simclr_long.pt"
    code, err = kill_mid_way(
        long_project, stage_cmd("pretrain", "tiny_simclr_long"), resume, signal.SIGINT
    )
    assert code == 130 and "interrupted" in err and "Traceback" not in err


def test_a_diverged_loss_stops_with_a_clear_error_keeping_the_last_checkpoint(tmp_path):
    from tests.fl.test_engine import make_fed, simclr_loss, tiny_model, toy_data

    calls = {"n": 0}
    base = simclr_loss(0.5)

    def nan_in_round_2(model, params, buffers, batch):
        calls["n"] += 1
        loss = base(model, params, buffers, batch)
        return loss * float("nan") if calls["n"] > 7 else loss  # round 1: 2 + 2 + 3 steps

    from fedssl.stage.runtime import StageFailed

    model = tiny_model()
    fed = make_fed(model, toy_data(), tmp_path, rounds=3, loss=nan_in_round_2)
    with pytest.raises(StageFailed, match="loss is nan at round 2"):
        fed.run(fed.start(model))
    ck = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ck["state"]["round"] == 1


class Payload:
    """What a crafted artifact could make an unpickler do: run code."""

    def __reduce__(self):
        return (Path.touch, (Path("/tmp/fedssl-pickle-ran"),))


def test_a_crafted_pickle_in_an_artifact_path_is_refused(long_project, tmp_path):
    marker = Path("/tmp/fedssl-pickle-ran")
    marker.unlink(missing_ok=True)
    resume = long_project / "artifacts/.resume/pretrain__tiny_simclr_long.pt"
    resume.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"fingerprint": "x", "state": Payload()}, resume)
    proc = run(stage_cmd("pretrain", "tiny_simclr_long"), long_project, check=False)
    assert proc.returncode == 2 and "refused unread" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()
    resume.unlink()
