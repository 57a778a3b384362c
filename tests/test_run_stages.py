"""benchmarks/run_stages.py, the runner for a lent machine without Snakemake or DVC: stages run
upstream first, a failure skips what depends on it, the deadline stops the running stage and
skips the rest, and every stage gets a TSV row."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

from tests.fixtures import REPO


def runner():
    spec = importlib.util.spec_from_file_location("run_stages", REPO / "benchmarks/run_stages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_failures_skip_their_downstream_and_the_deadline_stops_the_running_stage(tmp_path):
    module = runner()
    stage = lambda cmd, *up: SimpleNamespace(cmd=cmd, upstream=list(up))
    stages = {
        "a": stage("echo hello"),
        "b": stage("exit 3", "a"),
        "c": stage("true", "b"),  # its upstream failed
        "d": stage("true", "a"),  # independent of the failure
        "e": stage("sleep 30"),  # outlives the budget
        "f": stage("true"),  # after the deadline
    }
    module.Dag = lambda pipeline: SimpleNamespace(stages=stages)
    log = tmp_path / "stages.tsv"
    code = module.main(["toy", "--budget", "2", "--log", str(log), "--logs", str(tmp_path)])
    rows = [line.split("\t") for line in log.read_text().splitlines()[1:]]
    assert [(name, status) for name, status, _ in rows] == [
        ("a", "ok"), ("b", "failed"), ("c", "skipped"), ("d", "ok"), ("e", "stopped"),
        ("f", "skipped"),
    ]  # fmt: skip
    assert code == 1
    assert float(rows[4][2]) < 10  # stopped at the deadline, not after its 30 s
    assert (tmp_path / "a.log").read_text() == "hello\n"
