"""Snakemake and DVC driving the real stages on a tiny project: both front ends agree on what is
up to date, an edited param reruns only its stage and what depends on it, and restored file
times (as after `dvc checkout`) rerun nothing."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures import made_tiny_project, run

pytestmark = pytest.mark.timeout(900)


def planned_jobs(project: Path) -> set[str]:
    """Jobs a Snakemake dry run would execute (the `all` target excluded)."""
    out = run(["snakemake", "-n", "--cores", "1"], project).stdout
    return {m.group(1) for m in re.finditer(r"^(\w+__\w+)\s+\d+$", out, re.M)}


def dvc_stale(project: Path, *targets: str) -> set[str]:
    """Stages DVC would run, but its `dag` check (which only validates the params)."""
    out = run(["dvc", "status", "--json", *targets], project).stdout
    return set(json.loads(out or "{}")) - {"dag"}


def set_probe_lr(project: Path, exp: str, lr: float) -> None:
    path = project / "params" / "experiments" / f"{exp}.yaml"
    text = re.sub(r"(linear_probe: \{epochs: \d+, lr: )[0-9.]+", rf"\g<1>{lr}", path.read_text())
    path.write_text(text)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return made_tiny_project(tmp_path_factory.mktemp("project"))


def test_snakemake_runs_every_stage_and_reports(project):
    report = (project / "results/reports/default/report.csv").read_text().splitlines()
    assert report[0].startswith("experiment,title,partition,method")
    rows = {line.split(",")[0]: line.split(",") for line in report[1:]}
    assert set(rows) == {"tiny_simclr", "tiny_random", "tiny_pixels"}
    metrics = json.loads((project / "results/experiments/tiny_pixels/metrics.json").read_text())
    assert metrics["linear_top1"] == 100.0  # the toy classes are linearly separable in pixels
    rounds = (project / "results/experiments/tiny_simclr/rounds.tsv").read_text().splitlines()
    assert len(rounds) == 3  # header + 2 rounds
    assert (project / "artifacts/reports/default/partition_tiny_dir05_m3.png").read_bytes()[
        :4
    ] == b"\x89PNG"


def test_every_stage_logs_its_start_and_its_wall_time(project):
    logs = sorted((project / "artifacts/logs").glob("*.log"))
    assert len(logs) == 13  # data, partition, 3 x (pretrain/features, evaluate, costs), report
    for log in logs:
        lines = log.read_text().splitlines()
        assert re.fullmatch(rf"{log.stem}: started on \S+", lines[0]), log.name
        assert any(re.fullmatch(rf"{log.stem}: done in \d+\.\d s", x) for x in lines), log.name


def test_dvc_sees_nothing_to_do_after_snakemake(project):
    assert dvc_stale(project) == set()
    assert planned_jobs(project) == set()


def test_dvc_plots_show_draws_each_probe_curve_offline(project):
    """The linear probe's curve is a DVC plot: its test top-1 over its epochs, ending at the
    top-1 in metrics.json; the rounds' loss beside it."""
    plots = json.loads(run(["dvc", "plots", "show", "--json"], project).stdout)
    assert not plots.get("errors"), plots["errors"]
    for exp in ("tiny_simclr", "tiny_random", "tiny_pixels"):
        results = f"results/experiments/{exp}"
        content = plots["data"][f"{results}/linear_epochs.tsv"][0]["content"]
        assert content["encoding"]["x"]["field"] == "epoch"
        assert content["layer"][0]["encoding"]["y"]["field"] == "test_top1"
        rows = content["data"]["values"]
        assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4, 5]  # the probe's 5 epochs
        top1 = json.loads((project / results / "metrics.json").read_text())["linear_top1"]
        assert float(rows[-1]["test_top1"]) == top1
    assert "results/experiments/tiny_simclr/rounds.tsv" in plots["data"]


def test_param_edit_reruns_only_downstream_in_both_front_ends(project):
    set_probe_lr(project, "tiny_simclr", 0.05)
    assert planned_jobs(project) == {"evaluate__tiny_simclr", "report__default"}
    assert dvc_stale(project) == {"evaluate__tiny_simclr"}  # DVC learns about report later
    run(["dvc", "repro"], project)
    assert dvc_stale(project) == set()
    assert planned_jobs(project) == set()  # what DVC ran, Snakemake does not redo


def test_restored_file_times_rerun_nothing(project):
    restored = time.time() - 60  # as `dvc checkout` leaves them: all files freshly written,
    for path in sorted((project / "artifacts").rglob("*"), reverse=True):
        os.utime(path, (restored, restored))
    for path in (project / "artifacts" / "data").rglob("*"):
        os.utime(path, (restored + 30, restored + 30))  # the data set newest of all
    assert planned_jobs(project) == set()
    assert dvc_stale(project) == set()


def evaluated_lr(project: Path, exp: str) -> float:
    meta = json.loads((project / f"artifacts/experiments/{exp}/evaluate/meta.json").read_text())
    return meta["inputs"]["params"][f"params/experiments/{exp}.yaml"]["linear_probe"]["lr"]


def test_one_stage_by_name_in_both_front_ends(project):
    """The probe on toy data scores 100% whatever the lr, so metrics.json comes out identical,
    but its curve (the loss per epoch) does not: the report, downstream of both, is then what
    both front ends would run next, and nothing else."""
    set_probe_lr(project, "tiny_random", 0.03)
    run(["snakemake", "--cores", "1", "evaluate__tiny_random"], project)
    assert evaluated_lr(project, "tiny_random") == 0.03
    assert (
        json.loads((project / "results/experiments/tiny_random/metrics.json").read_text())[
            "linear_top1"
        ]
        == 100.0
    )
    assert planned_jobs(project) == {"report__default"} == dvc_stale(project)
    set_probe_lr(project, "tiny_random", 0.04)
    run(["dvc", "repro", "--single-item", "evaluate__tiny_random"], project)
    assert evaluated_lr(project, "tiny_random") == 0.04
    assert planned_jobs(project) == {"report__default"} == dvc_stale(project)
    run(["dvc", "repro"], project)
    assert planned_jobs(project) == set() and dvc_stale(project) == set()


def test_invalid_params_stop_snakemake_before_any_job(project):
    path = project / "params" / "experiments" / "tiny_simclr.yaml"
    good = path.read_text()
    try:
        path.write_text(good.replace("temperature: 0.5", "temperature: -1"))
        proc = run(["snakemake", "-n", "--cores", "1"], project, check=False)
        assert proc.returncode != 0
        assert "tiny_simclr.yaml" in proc.stdout + proc.stderr
        assert "method.fedsimclr.temperature" in proc.stdout + proc.stderr
    finally:
        path.write_text(good)


@pytest.mark.slow
def test_an_extending_experiment_follows_its_base_in_both_front_ends(project):
    """`extends`: a variant inherits its base's settings; editing an inherited one reruns the
    variant in Snakemake and DVC alike, and restoring it makes both see nothing to do. (Slow:
    test_params checks the variant's fingerprint and DVC params in process, and a preset edit
    in both front ends is one of the edits below.)"""
    (project / "params/experiments/tiny_random_w8.yaml").write_text(
        "extends: tiny_random\ntitle: Random init, width 8\nmethod: {model: {width: 8}}\n"
    )
    with open(project / "params" / "pipelines.yaml", "a") as f:
        f.write("  variants: [tiny_random_w8]\n")
    run(["python", "-m", "fedssl.pipeline", "write"], project)
    config = ["--config", "pipeline=variants"]
    run(["snakemake", "--cores", "2", "--resources", "gpu=1", *config], project)

    def stale() -> tuple[set[str], set[str]]:
        out = run(["snakemake", "-n", "--cores", "1", *config], project).stdout
        planned = {m.group(1) for m in re.finditer(r"^(\w+__\w+)\s+\d+$", out, re.M)}
        status = run(["dvc", "status", "--json", "pipelines/variants/dvc.yaml"], project).stdout
        return planned, {k.split(":")[-1] for k in json.loads(status or "{}")} - {"dag"}

    assert stale() == (set(), set())
    base = project / "params/experiments/tiny_random.yaml"
    good = base.read_text()
    try:
        base.write_text(good.replace("batch_size: 256}", "batch_size: 128}"))
        planned, dvc = stale()
        assert planned == {
            "features__tiny_random_w8",
            "evaluate__tiny_random_w8",
            "report__variants",
        }
        assert dvc == {"features__tiny_random_w8"}  # DVC reports the first stale stage
    finally:
        base.write_text(good)
    assert stale() == (set(), set())


@functools.cache
def default_upstream(project: Path) -> dict[str, list[str]]:
    """Each stage of the default pipeline -> the stages it reads (no edit changes its shape)."""
    out = run(
        [
            "python",
            "-c",
            "from fedssl.plan.dag import Dag; import json; d = Dag('default');"
            " print(json.dumps({n: s.upstream for n, s in d.stages.items()}))",
        ],
        project,
    )
    return json.loads(out.stdout)


def downstream(project: Path, names: set[str]) -> set[str]:
    """``names`` and every stage after them in the default pipeline's DAG."""
    result = set(names)
    for name, ups in default_upstream(project).items():  # upstream first
        if any(u in result for u in ups):
            result.add(name)
    return result


# (file, old text or None to append a comment, new text): code a stage imports, a default in
# the params models, a preset. Each must rerun the same stages in Snakemake and DVC. More code
# files of the kinds above (a stage script, a library module) run with `-m slow`.
EDITS = [
    pytest.param("fedssl/stage/runtime.py", None, None, id="fedssl/stage/runtime.py"),
    pytest.param("fedssl/methods/none.py", None, None, id="fedssl/methods/none.py"),
    pytest.param("fedssl/params.py", "k: PositiveInt = 20", "k: PositiveInt = 21", id="default"),
    pytest.param("params/experiments/tiny_random.yaml", "k: 5,", "k: 4,", id="preset"),
] + [
    pytest.param(file, None, None, id=file, marks=pytest.mark.slow)
    for file in (
        "fedssl/evaluations/evaluate.py",
        "fedssl/eval/probes.py",
        "fedssl/losses.py",
        "fedssl/data/partition.py",
    )
]


@pytest.mark.parametrize("file, old, new", EDITS)
def test_any_edit_reruns_the_same_stages_in_both_front_ends(project, file, old, new):
    path = project / file
    good = path.read_text()
    try:
        path.write_text(good + "# an edit\n" if old is None else good.replace(old, new))
        planned, stale = planned_jobs(project), dvc_stale(project, "dvc.yaml")
        assert stale, f"DVC saw no change after editing {file}"
        assert stale <= planned and downstream(project, stale) == planned, (stale, planned)
    finally:
        path.write_text(good)
    assert planned_jobs(project) == set() and dvc_stale(project, "dvc.yaml") == set()


def test_code_dependencies_follow_the_import_graph(project):
    """What each front end tracks comes from the imports: training stages depend on the losses
    their method uses, the probe stage does not; a stage depends on its method's module."""
    out = run(
        [
            "python",
            "-c",
            "from fedssl.plan.dag import Dag; import json; d = Dag('default');"
            " print(json.dumps({n: s.code for n, s in d.stages.items()}))",
        ],
        project,
    )
    code = json.loads(out.stdout)
    assert "fedssl/losses.py" in code["pretrain__tiny_simclr"]
    assert "fedssl/methods/federated.py" in code["pretrain__tiny_simclr"]
    assert "fedssl/losses.py" not in code["evaluate__tiny_simclr"]
    assert "fedssl/eval/probes.py" in code["evaluate__tiny_simclr"]
    assert "fedssl/methods/none.py" in code["features__tiny_random"]
    assert "fedssl/methods/fedsimclr/__init__.py" not in code["pretrain__tiny_random"]
    dvc = (project / "dvc.yaml").read_text()
    assert "- fedssl/eval/probes.py" in dvc


def test_experiments_that_differ_downstream_share_upstream_stages(project):
    """A variant that changes only the k-NN probe reuses the base's pretraining and features
    (stages named after the experiment that owns their content), in both front ends."""
    (project / "params/experiments/tiny_simclr_k3.yaml").write_text(
        "extends: tiny_simclr\ntitle: FedSimCLR, 3-NN\nknn: {k: 3}\n"
    )
    with open(project / "params" / "pipelines.yaml", "a") as f:
        f.write("  shared: [tiny_simclr, tiny_simclr_k3]\n")
    run(["python", "-m", "fedssl.pipeline", "write"], project)
    pretrained = (project / "artifacts/experiments/tiny_simclr/pretrain/meta.json").read_text()
    out = run(["snakemake", "-n", "--cores", "1", "--config", "pipeline=shared"], project).stdout
    planned = {m.group(1) for m in re.finditer(r"^(\w+__\w+)\s+\d+$", out, re.M)}
    assert planned == {"evaluate__tiny_simclr_k3", "report__shared"}
    run(
        ["snakemake", "--cores", "2", "--resources", "gpu=1", "--config", "pipeline=shared"],
        project,
    )
    assert (
        project / "artifacts/experiments/tiny_simclr/pretrain/meta.json"
    ).read_text() == pretrained  # trained once
    assert not (project / "artifacts/experiments/tiny_simclr_k3/pretrain").exists()
    status = run(["dvc", "status", "--json", "pipelines/shared/dvc.yaml"], project).stdout
    assert set(json.loads(status or "{}")) <= {"dag"}
    dvc = (project / "pipelines/shared/dvc.yaml").read_text()
    assert "evaluate__tiny_simclr_k3:" in dvc and "pretrain__tiny_simclr_k3" not in dvc
    rows = (project / "results/reports/shared/report.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["tiny_simclr", "tiny_simclr_k3"]


def test_an_edit_that_cannot_change_results_can_be_accepted_in_both_front_ends(project):
    path = project / "fedssl/eval/probes.py"
    good = path.read_text()
    try:
        path.write_text(good + "# a comment\n")
        assert dvc_stale(project, "dvc.yaml") and planned_jobs(project)
        out = run(["python", "-m", "fedssl.pipeline", "accept", "default"], project).stdout
        assert "evaluate__tiny_simclr" in out and "prepare_data__tiny" not in out
        assert planned_jobs(project) == set() and dvc_stale(project, "dvc.yaml") == set()
    finally:
        path.write_text(good)
        run(["python", "-m", "fedssl.pipeline", "accept", "default"], project)
    assert planned_jobs(project) == set() and dvc_stale(project, "dvc.yaml") == set()


def test_accept_fails_loudly_where_dvc_cannot_commit(project):
    """Accepting stages whose declared output is missing: `dvc commit` fails, and so does
    accept (exit status non-zero, a line that says why), rather than reporting success while
    DVC still sees them as changed."""
    path = project / "fedssl/eval/probes.py"
    curve = project / "results/experiments/tiny_simclr/linear_epochs.tsv"
    good, kept = path.read_text(), curve.read_bytes()
    try:
        path.write_text(good + "# a comment\n")
        curve.unlink()
        proc = run(["python", "-m", "fedssl.pipeline", "accept", "default"], project, check=False)
        assert proc.returncode != 0 and "dvc commit failed" in proc.stderr
        assert "evaluate__tiny_simclr" in dvc_stale(project, "dvc.yaml")
    finally:
        path.write_text(good)
        curve.write_bytes(kept)
        run(["python", "-m", "fedssl.pipeline", "accept", "default"], project)
    assert planned_jobs(project) == set() and dvc_stale(project, "dvc.yaml") == set()


def offline_env() -> dict[str, str]:
    """The environment with every download refused at once, as on a machine without internet."""
    proxy = "http://127.0.0.1:9"  # the discard port: nothing listens there
    return {**os.environ, "http_proxy": proxy, "https_proxy": proxy, "no_proxy": ""}


def test_a_bad_edit_costs_nothing_in_either_front_end(project):
    """A data set moved to where it is not and cannot be downloaded fails the run in either
    front end; reverting the edit leaves both nothing to do, and the failed Snakemake run did
    not record the bad params in DVC (not even its `dag` check)."""
    import subprocess

    path = project / "params/datasets/tiny.yaml"
    good = path.read_text()
    lock = (project / "dvc.lock").read_text()
    bad = good.replace("data_root: raw", "data_root: nowhere")
    try:
        for cmd in (["snakemake", "--cores", "1"], ["dvc", "repro"]):
            path.write_text(bad.replace("download: false", "download: true"))
            proc = subprocess.run(
                cmd, cwd=project, capture_output=True, text=True, env=offline_env()
            )
            assert proc.returncode != 0, cmd
            assert "could not be downloaded" in proc.stdout + proc.stderr, cmd
            if cmd[0] == "snakemake":
                assert (project / "dvc.lock").read_text() == lock
            path.write_text(good)
            assert planned_jobs(project) == set(), cmd
            assert dvc_stale(project) == set(), cmd
            if cmd[0] == "snakemake":
                status = run(["dvc", "status", "--json"], project).stdout
                assert json.loads(status or "{}") == {}
    finally:
        path.write_text(good)


def long_pretraining(project: Path) -> list[str]:
    """A Snakemake command running the pretraining of a 20-round FedSimCLR in a pipeline of its
    own: long enough to be stopped mid-way on a loaded machine (the default pipeline's 2
    rounds can end before the signal lands), and no other pipeline is touched."""
    (project / "params/experiments/tiny_simclr_long.yaml").write_text(
        "extends: tiny_simclr\ntitle: FedSimCLR, 20 rounds\nmethod: {federation: {rounds: 20}}\n"
    )
    pipelines = project / "params/pipelines.yaml"
    if "  long:" not in pipelines.read_text():
        with open(pipelines, "a") as f:
            f.write("  long: [tiny_simclr_long]\n")
    return ["snakemake", LONG_STAGE, "--cores", "1", "--config", "pipeline=long"]


LONG_STAGE = "pretrain__tiny_simclr_long"


def start_and_stop(project: Path, sig: int) -> tuple[subprocess.Popen, float, str]:
    """Start the long pretraining from scratch through Snakemake, send ``sig`` to its process
    group (as a terminal does) once its first checkpoint is on disk: (the process, seconds it
    took to return after the signal, its output)."""
    resume = project / "artifacts/.resume"
    for leftover in [
        *resume.glob(f"{LONG_STAGE}*pt"),
        project / f"artifacts/.receipts/{LONG_STAGE}.done",
    ]:
        leftover.unlink(missing_ok=True)
    proc = subprocess.Popen(
        long_pretraining(project),
        cwd=project,
        start_new_session=True,
        # as from a terminal: a test run in the background (`make test &`) ignores SIGINT, and
        # Python started with SIGINT ignored never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        while proc.poll() is None and not list(resume.glob(f"{LONG_STAGE}*pt")):
            time.sleep(0.01)  # until the stage is inside its training loop
        os.killpg(proc.pid, sig)
        start = time.time()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc, time.time() - start, out


def test_ctrl_c_returns_within_seconds_with_the_stages_message(project):
    """Ctrl-C (SIGINT to the terminal's process group) during a training stage: Snakemake
    returns within seconds, and the stage's "interrupted" line reaches the terminal and the
    log."""
    proc, seconds, out = start_and_stop(project, signal.SIGINT)
    assert seconds < 30 and proc.returncode != 0
    message = "interrupted: a stage that checkpoints resumes where it stopped"
    assert message in out
    assert message in (project / f"artifacts/logs/{LONG_STAGE}.log").read_text()


@pytest.mark.slow
def test_after_a_hard_kill_unlocking_is_all_the_next_run_needs(project):
    """SIGKILL to Snakemake and its stage (a closed terminal): the next run stops on the lock
    left behind; after `snakemake --unlock` a plain run (no `--rerun-incomplete`) resumes the
    stage from its checkpoint and finishes, as the README says."""
    proc, _, _ = start_and_stop(project, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    locked = run(long_pretraining(project), project, check=False)
    assert locked.returncode != 0
    assert "Directory cannot be locked" in locked.stdout + locked.stderr
    run(["snakemake", "--unlock", "--cores", "1"], project)
    run(long_pretraining(project), project)
    assert "resuming from round" in (project / f"artifacts/logs/{LONG_STAGE}.log").read_text()
    assert (project / f"artifacts/.receipts/{LONG_STAGE}.done").exists()
    assert not list((project / "artifacts/.resume").glob(f"{LONG_STAGE}*pt"))
