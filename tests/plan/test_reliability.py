"""Nothing lost and nothing consumed unseen (issue 37), on a tiny project run by Snakemake:

* a stage killed under a params edit leaves every committed file as it was, and once the edit
  is reverted both front ends see nothing to do (its round log lands only on success);
* a stage refuses an input that changed since its producer wrote it, naming the file and the
  stage to rerun (eight tamperings);
* one lock per stage, taken by both front ends: a second run of a running stage is refused
  in one line (Snakemake running it, DVC asked to);
* a checkpoint is resumed only under the compute settings it was written with;
* saved bytes do not depend on Python's hash seed (SCAFFOLD's control variates);
* resource errors and damaged files end in one line naming the file;
* a failing or killed report stage leaves the committed report as it was, in both front ends,
  and results land from an ``artifacts/`` on another file system;
* Snakemake sees at planning every file a stage wrote that changed since, as DVC does; a
  stage writes the same bytes whichever front end runs it; a run of one front end refuses the
  other's; the end-of-run `dvc commit` says each stage; planning removes what killed stages
  left (issue 53).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedssl.stage.runtime import (
    StageFailed,
    atomic_dir,
    load_checkpoint,
    resume_fingerprint,
    stage_lock,
    torch_save,
    write_error,
    write_json,
)
from tests.fixtures import REPO, in_project, made_tiny_project, run

pytestmark = pytest.mark.timeout(900)
STAGE = "pretrain__tiny_simclr"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return made_tiny_project(tmp_path_factory.mktemp("reliability"))


def committed(root: Path) -> dict[str, bytes]:
    """Every file git would commit of a run: the results and dvc.lock."""
    files = [*sorted((root / "results").rglob("*")), root / "dvc.lock"]
    return {str(f.relative_to(root)): f.read_bytes() for f in files if f.is_file()}


def planned_jobs(root: Path) -> set[str]:
    out = run(["snakemake", "-n", "--cores", "1"], root).stdout
    return {m.group(1) for m in re.finditer(r"^(\w+__\w+)\s+\d+$", out, re.M)}


def dvc_stale(root: Path) -> set[str]:
    out = run(["dvc", "status", "--json"], root).stdout
    return set(json.loads(out or "{}")) - {"dag"}


def stage_pid(root: Path, stage: str) -> int | None:
    """The process holding ``stage``'s lock (it writes itself into the lock file)."""
    lock = root / "artifacts/.locks" / f"{stage}.lock"
    found = re.search(r"process (\d+)", lock.read_text()) if lock.exists() else None
    return int(found.group(1)) if found else None


def snakemake_in_background(project, *args: str) -> subprocess.Popen:
    """Snakemake on one core in its own session (so a test can kill its whole group)."""
    return subprocess.Popen(
        ["snakemake", *args, "--cores", "1"],
        cwd=project,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# ------------------------------------------------------------------ 1 and 3: kill, lock
def test_a_killed_stage_under_an_edit_leaves_committed_files_and_both_front_ends_as_they_were(
    project,
):
    """Snakemake runs the pretraining under an edited lr and 5000 rounds; while it runs, DVC is
    asked to run the same stage and is refused in one line (the stage's lock); the stage is
    killed with SIGKILL after its second round; the edit is reverted. Every committed file is
    byte for byte what it was, and neither front end has anything to do."""
    before = committed(project)
    params = project / "params/experiments/tiny_simclr.yaml"
    good = params.read_text()
    params.write_text(good.replace("rounds: 2", "rounds: 5000").replace("lr: 0.001", "lr: 0.003"))
    log = project / f"artifacts/logs/{STAGE}.log"
    log.unlink(missing_ok=True)
    proc = snakemake_in_background(project, STAGE)
    try:
        deadline = time.time() + 600
        while "round 2/5000" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.time() < deadline, "the stage did not start"
            time.sleep(0.05)
        pid = stage_pid(project, STAGE)
        second = run(["dvc", "repro", "--single-item", STAGE], project, check=False)
        said = (second.stdout + second.stderr).splitlines()
        refusals = [ln for ln in said if "already running" in ln]
        assert second.returncode != 0 and len(refusals) == 1, said[-20:]
        assert f"{STAGE} is already running (process {pid} on " in refusals[0]
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        params.write_text(good)
    assert committed(project) == before
    left = leftovers(project)  # its partial output and results, and its checkpoint
    assert any(".partial-" in f for f in left) and f"artifacts/.resume/{STAGE}.pt" in left
    assert planned_jobs(project) == set()
    assert dvc_stale(project) == set()
    assert leftovers(project) == [], "planning removes what the killed stage left"


def leftovers(root: Path) -> list[str]:
    """Scratch folders of stages and resume checkpoints under ``artifacts/``."""
    found = [*root.glob("artifacts/**/*.partial-*"), *root.glob("artifacts/.resume/*")]
    return sorted(str(f.relative_to(root)) for f in found)


def test_a_second_run_of_a_running_stage_is_refused_by_both_front_ends(project):
    """The stage's lock held (as by a run in progress): Snakemake forced to run it and DVC
    forced to run it both stop with the same one line, and nothing changes."""
    before = committed(project)
    with in_project(project), stage_lock(STAGE):
        for cmd in (
            ["snakemake", STAGE, "--forcerun", STAGE, "--cores", "1"],
            ["dvc", "repro", "--force", "--single-item", STAGE],
        ):
            proc = run(cmd, project, check=False)
            lines = (proc.stdout + proc.stderr).splitlines()
            said = [ln for ln in lines if f"{STAGE} is already running" in ln]
            assert proc.returncode != 0 and said, (cmd, proc.stderr[-2000:])
            assert f"(process {os.getpid()} on " in said[0]
    assert committed(project) == before
    assert planned_jobs(project) == set()


def test_each_process_writes_its_own_scratch_folder_and_a_dead_ones_is_removed(tmp_path):
    final = tmp_path / "out"
    dead = tmp_path / "out.partial-999999999"  # no such process
    alive = tmp_path / f"out.partial-{os.getppid()}"  # another live process's
    for d in (dead, alive):
        d.mkdir()
    with atomic_dir(final) as scratch:
        assert scratch.name == f"out.partial-{os.getpid()}"
        (scratch / "x").write_text("1")
        assert not dead.exists() and alive.exists()
    assert (final / "x").read_text() == "1" and not scratch.exists()


# ------------------------------------------------------------------ 2: tampered inputs
def flip_byte(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def rewrite_clients(path: Path) -> None:
    """A valid clients.npz of another split (the clients' indices rotated)."""
    with np.load(path) as z:
        clients = [z[k] for k in sorted(z.files)]
    np.savez(path, **{f"client_{i}": c for i, c in enumerate(clients[1:] + clients[:1])})


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def drop_a_file(folder: Path) -> None:
    (folder / "extra.npy").write_bytes(b"")


PARTITION, DATA = "partition__tiny_dir05_m3", "prepare_data__tiny"
# (what is tampered with, how, the stage that reads it, the stage that wrote it)
TAMPERINGS = {
    "flipped byte in train_images.npy": (
        "artifacts/data/tiny/train_images.npy",
        flip_byte,
        ("partition", "tiny_dir05_m3"),
        DATA,
    ),
    "flipped byte in train_labels.npy": (
        "artifacts/data/tiny/train_labels.npy",
        flip_byte,
        ("features", "tiny_simclr"),
        DATA,
    ),
    "rewritten valid clients.npz": (
        "artifacts/partitions/tiny_dir05_m3/clients.npz",
        rewrite_clients,
        ("pretrain", "tiny_simclr"),
        PARTITION,
    ),
    "edited class_counts.json": (
        "artifacts/partitions/tiny_dir05_m3/class_counts.json",
        lambda p: p.write_text(p.read_text().replace("]", " ]", 1)),
        ("pretrain", "tiny_simclr"),
        PARTITION,
    ),
    "flipped byte in the model's tensor data": (
        "artifacts/experiments/tiny_simclr/pretrain/model.pt",
        lambda p: flip_byte(p, p.stat().st_size // 2),
        ("features", "tiny_simclr"),
        STAGE,
    ),
    "truncated features": (
        "artifacts/experiments/tiny_simclr/features/features.npz",
        truncate,
        ("evaluate", "tiny_simclr"),
        "features__tiny_simclr",
    ),
    "a file added to an output folder": (
        "artifacts/experiments/tiny_simclr/features",
        drop_a_file,
        ("evaluate", "tiny_simclr"),
        "features__tiny_simclr",
    ),
    "edited committed round log": (
        "results/experiments/tiny_simclr/rounds.tsv",
        lambda p: p.write_text(p.read_text() + "2\n"),
        ("features", "tiny_simclr"),
        STAGE,
    ),
}


@pytest.mark.parametrize("tampering", TAMPERINGS)
def test_a_stage_refuses_an_input_that_changed_since_its_producer_wrote_it(project, tampering):
    """Through the stage runtime (what both front ends run): the stage stops before its body
    with one line naming the file and the stage to rerun; its output is left as it was."""
    from fedssl.stage.context import StageContext

    target, tamper, (kind, name), producer = TAMPERINGS[tampering]
    path = project / target
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    saved = {f: f.read_bytes() for f in files if f.is_file()}
    ran = []
    with in_project(project):
        out = StageContext(kind, name).output_dir
        meta = (out / "meta.json").read_bytes()
        try:
            tamper(path)
            with pytest.raises(StageFailed) as refused:
                with StageContext(kind, name).run():
                    ran.append(kind)
        finally:
            for extra in set(path.rglob("*") if path.is_dir() else []) - set(saved):
                extra.unlink()
            for f, content in saved.items():
                f.write_bytes(content)
        assert (out / "meta.json").read_bytes() == meta
    message = str(refused.value)
    shown = str(path.relative_to(project)) if path.is_file() else target + "/extra.npy"
    assert message.startswith(f"{shown}: changed since {producer} wrote it"), message
    assert f"rerun it (`snakemake {producer} --forcerun {producer}`" in message
    assert "\n" not in message and not ran


def unseen(damage):
    """``damage`` done in place keeping the file's size and mtime, which planning trusts (as
    DVC's status does): only a stage's own check, which hashes every input it reads, sees it."""

    def done(path: Path) -> None:
        stat = path.stat()
        damage(path)
        assert path.stat().st_size == stat.st_size
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    return done


def test_snakemake_refuses_a_tampered_partition_instead_of_training_on_it(project):
    """The issue's probe: a rewritten (valid) clients.npz of the same size and mtime, and an
    lr edit: Snakemake's pretraining stops with the file and the stage to rerun; nothing
    committed changes."""
    before = committed(project)
    clients = project / "artifacts/partitions/tiny_dir05_m3/clients.npz"
    params = project / "params/experiments/tiny_simclr.yaml"
    good, saved = params.read_text(), clients.read_bytes()
    try:
        unseen(rewrite_clients)(clients)
        params.write_text(good.replace("lr: 0.001", "lr: 0.002"))
        proc = run(["snakemake", STAGE, "--cores", "1"], project, check=False)
    finally:
        clients.write_bytes(saved)
        params.write_text(good)
    log = (project / f"artifacts/logs/{STAGE}.log").read_text()
    assert proc.returncode != 0
    assert f"artifacts/partitions/tiny_dir05_m3/clients.npz: changed since {PARTITION}" in log
    assert "Traceback" not in log
    assert committed(project) == before and planned_jobs(project) == set()


REPORT = "report__default"
REPORT_FILES = ("report.md", "report.csv", "report.json", "curves.png")


def test_a_failing_report_stage_leaves_the_committed_report_and_both_front_ends_as_they_were(
    project,
):
    """The report stage forced to fail (a partition heat-map it copies changed since its
    stage wrote it, keeping its size and mtime), run by each front end: Snakemake deletes a
    job's declared outputs before it runs, so the report's committed files must not be among
    them. Every committed file is byte for byte what it was, and neither front end plans
    anything once the input is back."""
    before = committed(project)
    heatmap = project / "artifacts/partitions/tiny_dir05_m3/heatmap.png"
    saved = heatmap.read_bytes()
    try:
        unseen(flip_byte)(heatmap)
        for cmd in (
            ["snakemake", REPORT, "--forcerun", REPORT, "--cores", "1"],
            ["dvc", "repro", "--force", "--single-item", REPORT],
        ):
            proc = run(cmd, project, check=False)
            said = proc.stdout + proc.stderr
            assert proc.returncode != 0 and "heatmap.png: changed since" in said, said[-2000:]
            assert committed(project) == before, cmd
    finally:
        heatmap.write_bytes(saved)
    assert planned_jobs(project) == set()
    assert dvc_stale(project) == set()


def test_a_killed_report_stage_leaves_the_committed_report_and_snakemake_with_nothing_to_do(
    project,
):
    """Snakemake runs the report; it is SIGKILLed while writing its files aside (its scratch
    copy of results/ exists). The committed report is as it was, and the next plan has
    nothing to do (the report's outputs as Snakemake sees them come back with the receipt)."""
    before = committed(project)
    scratch = project / "artifacts/reports"
    proc = snakemake_in_background(project, REPORT, "--forcerun", REPORT)
    try:
        deadline = time.time() + 300
        while not (writing := list(scratch.glob("default.partial-default-*"))):
            assert proc.poll() is None and time.time() < deadline, "the report did not start"
            time.sleep(0.005)
        os.kill(int(writing[0].name.rpartition("-")[2]), signal.SIGKILL)
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert committed(project) == before
    assert planned_jobs(project) == set()
    assert dvc_stale(project) == set()


def test_snakemakes_report_holds_the_committed_report(project, tmp_path):
    """`snakemake --report` (a zip) shows the report's four files, the committed bytes, seen
    through their copies beside the receipt."""
    import zipfile

    out = tmp_path / "report.zip"
    run(["snakemake", "--report", str(out), "--cores", "1"], project)
    with zipfile.ZipFile(out) as z:
        shown = {Path(n).name: z.read(n) for n in z.namelist() if "/data/raw/" in n}
    folder = project / "results/reports/default"
    assert shown == {f: (folder / f).read_bytes() for f in REPORT_FILES}


def cross_device_replace(monkeypatch) -> list[tuple[str, str]]:
    """``os.replace`` as on two file systems: a move between folders fails with EXDEV (as
    from ``artifacts/`` on a scratch disk to ``results/``); the moves refused are listed."""
    real, refused = os.replace, []

    def replace(src, dst, **kwargs):
        if Path(src).resolve().parent != Path(dst).resolve().parent:
            refused.append((str(src), str(dst)))
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src), None, str(dst))
        return real(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    return refused


def test_results_land_from_artifacts_on_another_file_system(project, monkeypatch):
    """The report stage rerun in process, every rename across folders refused with EXDEV:
    its committed files land by copy (the same bytes as before: an identical rerun), and no
    scratch copy is left in artifacts/."""
    from stages.report import run as report

    before = committed(project)
    refused = cross_device_replace(monkeypatch)
    with in_project(project):
        report(["default"])
    assert {dst for _, dst in refused} == {f"results/reports/default/{f}" for f in REPORT_FILES}
    assert committed(project) == before
    assert not [p for p in (project / "artifacts/reports").iterdir() if "partial" in p.name]


def test_a_move_across_file_systems_replaces_the_file_whole(tmp_path, monkeypatch):
    from fedssl.stage.runtime import move_file

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    src, dst = tmp_path / "a" / "x.json", tmp_path / "b" / "x.json"
    src.write_text("new")
    dst.write_text("old")
    refused = cross_device_replace(monkeypatch)
    move_file(src, dst)
    assert refused and dst.read_text() == "new" and not src.exists()
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["x.json"]


@pytest.fixture
def tmpfs(tmp_path):
    """A real tmpfs of 256 KiB mounted on a fresh folder (skipped where mounting needs
    privileges this test has not)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def test_the_report_lands_from_artifacts_on_a_real_tmpfs(project, tmpfs):
    """artifacts/reports on a tmpfs (a scratch disk): the report stage, run as the front ends
    run it, lands its committed files in results/ on the other file system."""
    before = committed(project)
    reports = project / "artifacts/reports"
    subprocess.run(["mount", "--bind", str(tmpfs), str(reports)], check=True)
    try:
        proc = run(["python", "-m", "stages.report", "default"], project, check=False)
        assert (reports / "default/meta.json").exists()
    finally:
        subprocess.run(["umount", str(reports)], check=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert committed(project) == before


# ------------------------------------------------------------------ issue 53: the front ends agree
def touch_up(path: Path) -> None:
    path.write_text(path.read_text() + "\n")


def add_beside(path: Path) -> None:
    path.write_bytes(b"")


# a file of each kind a stage writes, changed -> (how, the stage that wrote it)
DAMAGES = {
    "artifacts/data/tiny/train_images.npy": (flip_byte, DATA),  # pixels
    "artifacts/partitions/tiny_dir05_m3/clients.npz": (rewrite_clients, PARTITION),
    "artifacts/experiments/tiny_simclr/pretrain/model.pt": (  # the model checkpoint
        lambda p: flip_byte(p, p.stat().st_size // 2),
        STAGE,
    ),
    "results/experiments/tiny_simclr/rounds.tsv": (touch_up, STAGE),
    "artifacts/experiments/tiny_simclr/features/features.npz": (truncate, "features__tiny_simclr"),
    "artifacts/experiments/tiny_random/features/extra.npy": (add_beside, "features__tiny_random"),
    "results/experiments/tiny_simclr/metrics.json": (touch_up, "evaluate__tiny_simclr"),
    "artifacts/experiments/tiny_simclr/costs/costs.json": (touch_up, "costs__tiny_simclr"),
    "results/reports/default/report.md": (touch_up, REPORT),
    "results/reports/default/curves.png": (flip_byte, REPORT),
}


def test_snakemake_sees_at_planning_every_changed_file_dvc_sees(project):
    """Ten files of eight stages changed (pixels, a partition, a model, its round log,
    features, a file added to an output, metrics, costs, the final report and its figure):
    `snakemake -n` plans each one's stage, saying in its line the file and what restores it,
    as `dvc status` lists them; once restored, neither front end has anything to do."""
    saved = {p: (project / p).read_bytes() for p in DAMAGES if (project / p).exists()}
    try:
        for path, (damage, _) in DAMAGES.items():
            damage(project / path)
        proc = run(["snakemake", "-n", "--cores", "1"], project)
        dvc_sees = dvc_stale(project)
    finally:
        (project / "artifacts/experiments/tiny_random/features/extra.npy").unlink()
        for path, content in saved.items():
            (project / path).write_bytes(content)
    jobs = set(re.findall(r"^(\w+__\w+)\s+\d+$", proc.stdout, re.M))
    producers = {stage for _, stage in DAMAGES.values()}
    assert producers <= jobs and producers <= dvc_sees
    for path, (_, stage) in DAMAGES.items():
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"{stage} will run: ")]
        said = "changed since it was" if path in saved else "is not among the files it wrote"
        assert f"{path} {said}" in line, line
    restore = "`git checkout -- results/reports/default/report.md` restores it instead"
    assert restore in proc.stderr
    assert planned_jobs(project) == set() and dvc_stale(project) == set()


def test_planning_hashes_a_file_only_when_its_size_mtime_or_inode_moved(tmp_path, monkeypatch):
    from fedssl.stage import record

    monkeypatch.chdir(tmp_path)
    out, name = tmp_path / "out", "out/model.pt"
    out.mkdir()
    path = out / "model.pt"
    path.write_bytes(b"abc")
    digest = record.sha256_file(path)
    record.remember_files("s", {name: digest})
    hashed, sha256 = [], record.sha256_file
    monkeypatch.setattr(record, "sha256_file", lambda p: hashed.append(str(p)) or sha256(p))

    def changed(mtime: int | None = None) -> list[str]:
        if mtime is not None:
            os.utime(path, ns=(mtime, mtime))
        return record.changed_files("s", Path("out"), {name: digest})

    assert changed() == [] and hashed == []  # as it landed: no hash
    path.write_bytes(b"abd")
    assert changed(mtime=10**18) == [name] and hashed == [name]
    path.write_bytes(b"abc")  # put back: hashed once, then known intact
    assert changed(mtime=2 * 10**18) == [] and changed() == [] and hashed == [name, name]
    (out / "extra.npy").write_bytes(b"")
    assert changed() == ["out/extra.npy"]


RANDOM = "pretrain__tiny_random"


def test_a_stage_writes_the_same_bytes_whichever_front_end_runs_it(project):
    """A compute stage run by Snakemake, then by DVC: its output folder and dvc.lock are the
    same bytes (its meta.json once recorded the OpenMP wait policy, which only Snakemake sets,
    so a rerun by the other front end changed its bytes and its dvc.lock hash)."""
    folder = project / "artifacts/experiments/tiny_random/pretrain"

    def outputs() -> dict[str, bytes]:
        return {**{f.name: f.read_bytes() for f in folder.iterdir()}, **committed(project)}

    run(["snakemake", RANDOM, "--forcerun", RANDOM, "--cores", "1"], project)
    by_snakemake = outputs()
    run(["dvc", "repro", "--force", "--single-item", RANDOM], project)
    by_dvc = outputs()
    assert by_dvc.keys() == by_snakemake.keys() and "meta.json" in by_dvc
    assert [f for f in by_dvc if by_dvc[f] != by_snakemake[f]] == []


def test_a_run_of_one_front_end_refuses_the_other(project):
    """The run lock held by a DVC run: Snakemake starts no job; held by a Snakemake run: DVC's
    stage does not run. Each says so in one line naming the holder; nothing changes."""
    from fedssl.stage.runtime import hold_run, release_run

    before = committed(project)
    for holder, cmd, said in (
        ("dvc", ["snakemake", RANDOM, "--forcerun", RANDOM, "--cores", "1"], "error: a dvc"),
        (
            "snakemake",
            ["dvc", "repro", "--force", "--single-item", RANDOM],
            f"error: {RANDOM}: not run: a snakemake",
        ),
    ):
        with in_project(project):
            token = hold_run(holder)
        try:
            proc = run(cmd, project, check=False)
        finally:
            with in_project(project):
                release_run(token)
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "in progress" in ln]
        assert proc.returncode != 0 and len(lines) == 1, (cmd, proc.stderr[-2000:])
        assert lines[0].startswith(f"{said} run is in progress (process {os.getpid()} on ")
    assert committed(project) == before
    assert planned_jobs(project) == set()


def test_a_stage_under_snakemake_joins_a_snakemake_run_without_its_token(tmp_path, monkeypatch):
    """On a cluster's node a job runs under a `snakemake` process of its own, perhaps without
    the run's environment: it joins the Snakemake run holding the lock; a stage under no
    front end is refused in one line."""
    from fedssl.stage.runtime import RUN_ENV, hold_run, release_run

    monkeypatch.chdir(tmp_path)
    wrapper = tmp_path / "snakemake"  # a process of that name, the stage's parent
    wrapper.write_text('#!/bin/sh\n"$@"\n')
    wrapper.chmod(0o755)
    code = "from fedssl.stage.runtime import join_run\njoin_run('s')\nprint('joined')"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(RUN_ENV, None)
    token = hold_run("snakemake")
    try:
        under, alone = (
            subprocess.run([*cmd, sys.executable, "-c", code], env=env, capture_output=True)
            for cmd in ([str(wrapper)], [])
        )
    finally:
        release_run(token)
    assert under.stdout.decode().split() == ["joined"], under.stderr[-2000:]
    (line,) = alone.stderr.decode().strip().splitlines()[-1:]
    assert alone.returncode != 0 and "s: not run: a snakemake run is in progress" in line


def test_the_end_of_run_dvc_commit_says_each_stage(project, capfd):
    """Recording what Snakemake ran in dvc.lock (3 minutes of a 10-minute run, once silent)
    says each stage as it goes, with its size and time."""
    from fedssl.plan.dvcfile import commit_ran
    from fedssl.plan.freshness import RAN_LOG

    with in_project(project):
        RAN_LOG.write_text(f"{DATA}\n{PARTITION}\n")
        assert commit_ran() == [PARTITION, DATA]
    said = capfd.readouterr().err
    assert "dvc commit: recording 3 stages in dvc.lock" in said
    for i, name in enumerate(("dag", PARTITION, DATA), 1):
        assert re.search(rf"^dvc commit \[{i}/3\] {name}: [\d.]+ MB in [\d.]+ s$", said, re.M)
    assert re.search(r"^dvc commit: 3 stages in [\d.]+ s$", said, re.M)
    assert dvc_stale(project) == set()


# ------------------------------------------------------------------ 4: resume settings
def test_the_resume_fingerprint_holds_the_thread_count_and_precision(project):
    import torch

    from fedssl.stage.context import StageContext
    from fedssl.stage.record import fingerprint

    before = torch.get_num_threads()
    try:
        with in_project(project):
            ctx = StageContext("pretrain", "tiny_simclr")
            torch.set_num_threads(1)
            one = ctx.fingerprint
            torch.set_num_threads(2)
            two = ctx.fingerprint
            ctx.info["precision"] = "bf16"
            bf16 = ctx.fingerprint
            params = fingerprint(ctx.fingerprint_inputs)
    finally:
        torch.set_num_threads(before)
    assert "threads 1" in one and "threads 2" in two and len({one, two, bf16}) == 3
    assert one.split(" ")[0] == params and "precision bf16" in bf16


def test_a_checkpoint_of_other_compute_settings_is_said_and_not_resumed(tmp_path, capsys):
    path = tmp_path / "ck.pt"
    written = resume_fingerprint("abc", {"device": "cpu", "threads": 2})
    torch_save({"fingerprint": written, "round": 3}, path)
    assert load_checkpoint(path, written)["round"] == 3
    assert load_checkpoint(path, resume_fingerprint("abc", {"device": "cpu", "threads": 1})) is None
    said = capsys.readouterr().out
    assert "ck.pt: a checkpoint written under other compute settings " in said
    assert "settings (device cpu, threads 2), now (device cpu, threads 1): start" in said
    assert load_checkpoint(path, resume_fingerprint("xyz", {"threads": 2})) is None
    assert "a checkpoint of other params, ignored" in capsys.readouterr().out


# ------------------------------------------------------------------ 5: hash seed
HASH_SEED_PROBE = """
import hashlib, io, sys, torch
sys.path.insert(0, {repo!r})
from tests.methods.mpfedcon.test_mpfedcon import params, toy_federation
fed, model = toy_federation(__import__("pathlib").Path({tmp!r}), params("scaffold", rounds=1))
state = fed.run(fed.start(model))
buf = io.BytesIO()
torch.save({{"server": state.server, "clients": state.clients}}, buf)
print(hashlib.sha256(buf.getvalue()).hexdigest())
"""


def test_scaffold_saves_the_same_bytes_under_any_python_hash_seed(tmp_path):
    digests = set()
    for seed in ("1", "2"):
        folder = tmp_path / seed
        folder.mkdir()
        code = HASH_SEED_PROBE.format(repo=str(REPO), tmp=str(folder))
        env = {**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        digests.add(proc.stdout.split()[-1])
    assert len(digests) == 1


# ------------------------------------------------------------------ errors in one line
def test_a_resource_error_is_one_line_naming_the_path():
    for code, said in (
        (errno.ENOSPC, "no space left"),
        (errno.EROFS, "read-only"),
        (errno.EFBIG, "file size limit"),
    ):
        failed = write_error(OSError(code, os.strerror(code), "artifacts/x/model.pt"))
        assert str(failed).startswith("artifacts/x/model.pt: cannot write it: ") and said in str(
            failed
        )
    assert write_error(OSError(errno.ENOENT, "missing", "x")) is None


def under_file_size_limit(code: str, blocks: int) -> subprocess.CompletedProcess:
    """Python ``code`` run from the repository under ``ulimit -f blocks``."""
    return subprocess.run(
        ["bash", "-c", f'ulimit -f {blocks} && exec "{sys.executable}" -c "$0"', code],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


def test_the_file_size_limit_stops_a_stage_with_one_line(tmp_path):
    """A real EFBIG: under `ulimit -f 1` a stage's write fails; it exits 2 with one line."""
    code = (
        "from fedssl.stage.context import main_guard\n"
        "from fedssl.stage.runtime import write_json\n"
        f"main_guard(lambda argv: write_json({str(tmp_path / 'big.json')!r}, ['x' * 9999] * 99))"
    )
    proc = under_file_size_limit(code, blocks=1)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path}/big.json") and "file size limit" in line
    assert not list(tmp_path.iterdir())  # no half-written scratch file left


def test_torch_save_past_the_file_size_limit_stops_a_stage_with_one_line(tmp_path):
    """torch's writer hides the OSError behind its own error: under `ulimit -f 8` a model's
    write ends in one line naming the file, and no scratch file is left."""
    path = tmp_path / "model.pt"
    code = (
        "import torch\n"
        "from fedssl.stage.context import main_guard\n"
        "from fedssl.stage.runtime import torch_save\n"
        f"main_guard(lambda argv: torch_save({{'w': torch.zeros(99999)}}, {str(path)!r}))"
    )
    proc = under_file_size_limit(code, blocks=8)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: cannot write it: ") and "file size limit" in line
    assert not list(tmp_path.iterdir())


def test_torch_save_on_a_full_disk_is_one_line_naming_the_file(tmpfs):
    import torch

    path = tmpfs / "model.pt"
    with pytest.raises(StageFailed) as failed:
        torch_save({"w": torch.zeros(999_999)}, path)
    assert str(failed.value).startswith(f"{path}: cannot write it: no space left")
    assert not list(tmpfs.iterdir())


def test_a_damaged_features_file_stops_evaluation_in_one_line_naming_it(project, capsys):
    """The evaluation reads its features only once the run checked them: a truncated
    features.npz is named (and its producer) in one line, not a zip reader's traceback."""
    from fedssl.stage.context import main_guard
    from stages.evaluation import run as evaluation

    path = project / "artifacts/experiments/tiny_simclr/features/features.npz"
    saved = path.read_bytes()
    try:
        truncate(path)
        with in_project(project), pytest.raises(SystemExit) as exit_:
            main_guard(lambda argv: evaluation(["evaluate", "tiny_simclr"]))
    finally:
        path.write_bytes(saved)
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2
    assert line.startswith(f"error: {path.relative_to(project)}: changed since features__")


def test_damaged_npz_artifacts_are_refused_naming_the_file(tmp_path):
    """Without a recorded digest to check first (an output of an older run), the reader
    itself names the file: truncated, an object array (which would need pickle), an array
    missing; personal.npz alike."""
    from fedssl.data import ArtifactError, load_npz
    from fedssl.eval.personal import summarize

    keys = ("train_x", "train_y")
    path = tmp_path / "features.npz"
    np.savez(path, train_x=np.zeros((4, 2)), train_y=np.arange(4))
    assert load_npz(path, keys)["train_y"].tolist() == [0, 1, 2, 3]
    truncate(path)
    with pytest.raises(ArtifactError, match=r"features.npz: not a file of plain arrays"):
        load_npz(path, keys)
    np.savez(path, train_x=np.zeros((4, 2)))
    with pytest.raises(ArtifactError, match=r"features.npz: holds no array 'train_y'"):
        load_npz(path, keys)
    personal = tmp_path / "personal.npz"
    arrays = {k: np.zeros((2, 3)) for k in ("choice", "labels", "probs")}
    np.savez(personal, accuracy=np.array([{"a": 1}], dtype=object), **arrays)
    with pytest.raises(ArtifactError) as refused:
        summarize(personal, None)
    assert str(refused.value).startswith(f"{personal}: not a file of plain arrays (Object arr")
    assert "\n" not in str(refused.value)


class Crafted:
    """Not a plain value: torch refuses it under ``weights_only=True``."""


def test_a_refused_pickle_is_said_without_torchs_advice_to_load_it_unsafely(tmp_path, capsys):
    import torch

    from fedssl.stage.context import main_guard

    path = tmp_path / "model.pt"
    torch.save({"w": Crafted()}, path)
    with pytest.raises(SystemExit):
        main_guard(lambda argv: torch.load(path, weights_only=True))
    (line,) = capsys.readouterr().err.strip().splitlines()
    with pytest.raises(StageFailed) as refused:
        load_checkpoint(path, "f")
    for said in (line, str(refused.value)):
        assert f"{path}: " in said and "Unsupported global: GLOBAL tests.plan." in said
        assert "weights_only=False" not in said and "weights_only` set to `False" not in said
        assert "\x1b" not in said and "\n" not in said


def test_damaged_artifacts_and_checkpoints_are_refused_naming_the_file(tmp_path):
    from fedssl.data import ArtifactError, load_clients, load_split

    np.save(tmp_path / "train_images.npy", np.array([{"a": 1}], dtype=object))
    np.save(tmp_path / "train_labels.npy", np.arange(3))
    with pytest.raises(ArtifactError, match=r"train_images.npy: not a plain array file"):
        load_split(tmp_path, "train")
    (tmp_path / "clients.npz").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(ArtifactError, match=r"clients.npz: not the partition's client index"):
        load_clients(tmp_path)
    ck = tmp_path / "ck.pt"
    torch_save({"fingerprint": "f", "weights": list(range(999))}, ck)
    truncate(ck)
    with pytest.raises(StageFailed, match=r"ck.pt: not a readable checkpoint .*delete it"):
        load_checkpoint(ck, "f")


@pytest.mark.parametrize("damage", ["truncated", "not a checkpoint"])
def test_a_damaged_model_at_any_load_site_ends_the_stage_in_one_line_naming_it(
    tmp_path, capsys, damage
):
    """A method's own ``torch.load`` of a truncated or foreign file: the stage exits 2 with
    one line naming the file and what to do."""
    import torch

    from fedssl.stage.context import main_guard

    path = tmp_path / "model.pt"
    torch_save({"w": torch.zeros(999)}, path)
    truncate(path) if damage == "truncated" else path.write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit) as exit_:
        main_guard(lambda argv: torch.load(path, weights_only=True))
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and line.startswith(f"error: {path}: ")
    assert "rerun the stage that writes it" in line


def test_a_damaged_raw_data_file_is_refused_naming_it(tmp_path):
    from fedssl.data.catalog import load_dataset
    from fedssl.data.sets import DataNotFound
    from tests.fixtures import toy_images
    from tests.formats import write_fashion_mnist

    write_fashion_mnist(tmp_path, {"train": toy_images(40, 0), "t10k": toy_images(8, 1)})
    gz = sorted(tmp_path.rglob("train-images-idx3-ubyte*"))[0]
    good = gz.read_bytes()
    for damage in (good[: len(good) // 2], good[:-9] + bytes([good[-9] ^ 0xFF]) + good[-8:]):
        gz.write_bytes(damage)
        with pytest.raises(DataNotFound, match=re.escape(str(gz)) + r": .*(damaged|truncated)"):
            load_dataset("fashion_mnist", str(tmp_path))


def test_json_writes_replace_whole_files_through_a_per_process_scratch(tmp_path):
    path = tmp_path / "m.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2} and [p.name for p in tmp_path.iterdir()] == [
        "m.json"
    ]
    assert hashlib.sha256(path.read_bytes()).hexdigest()  # a whole, readable file


# ------------------------------------------------------------------ 8: make test-slurm
def test_the_local_slurm_cluster_stops_what_it_started_and_removes_its_config_link(tmp_path):
    """`local_cluster.sh stop` kills the daemons whose pid files `start` wrote (munged too,
    when it started it) and removes the config link it made; `make test-slurm` updates the
    package lists before installing."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "slurm.conf").write_text("")
    link = tmp_path / "slurm.conf"
    link.symlink_to(state / "slurm.conf")
    daemons = {n: subprocess.Popen(["sleep", "300"]) for n in ("munged", "slurmd", "slurmctld")}
    for name, proc in daemons.items():
        (state / f"{name}.pid").write_text(f"{proc.pid}\n")
    script = REPO / "tests/slurm/local_cluster.sh"
    env = {**os.environ, "SLURM_CONF_LINK": str(link)}
    try:
        subprocess.run([script, "stop", state], check=True, env=env)
        assert all(p.wait(timeout=10) == -signal.SIGTERM for p in daemons.values())
    finally:
        for p in daemons.values():
            p.kill() if p.poll() is None else None
    assert not link.exists() and not link.is_symlink()
    recipe = (REPO / "Makefile").read_text().split("test-slurm:")[-1].split("\n\n")[0]
    assert "apt-get update -qq && apt-get install" in recipe
