"""An override run (`fedssl run EXP KEY=VALUE`) is an experiment of its own, `EXP@<hash>`: it
writes under that id, shares what its overrides leave unchanged, never touches EXP's
committed results, and lives beside DVC experiments (`dvc exp run -S`) in the how-to's
order without either deleting the other's outputs."""

from __future__ import annotations

import json
import sys

import pytest

from tests.fixtures import made_tiny_project, run

pytestmark = pytest.mark.timeout(900)

PIXELS = "params/experiments/tiny_pixels.yaml"


def fedssl(project, *args, check=True):
    return run([sys.executable, "-m", "fedssl.cli", *args], project, check=check)


def metrics(project, experiment: str) -> dict:
    return json.loads((project / f"results/experiments/{experiment}/metrics.json").read_text())


def derived_id(stderr: str) -> str:
    """The id an override run announces ("override run EXP@h: ...")."""
    line = next(x for x in stderr.splitlines() if x.startswith("override run "))
    return line.split()[2].rstrip(":")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The tiny project run once by Snakemake (`dvc commit`ed by the run) and committed."""
    root = made_tiny_project(tmp_path_factory.mktemp("overrides"))
    run(["git", "add", "-A"], root)
    run(["git", "commit", "-qm", "results", "--no-verify"], root)
    return root


def test_an_override_run_keeps_apart_and_coexists_with_dvc_experiments(project):
    committed = metrics(project, "tiny_pixels")
    lock = (project / "dvc.lock").read_text()
    # a probe that barely trains: one epoch at a learning rate of 1e-6
    out = fedssl(project, "run", "tiny_pixels", "linear_probe.epochs=1", "linear_probe.lr=1e-6")
    derived = derived_id(out.stderr)
    assert derived.startswith("tiny_pixels@") and len(derived) == len("tiny_pixels@") + 8
    assert metrics(project, "tiny_pixels") == committed  # the committed result stays
    assert metrics(project, derived)["linear_top1"] < committed["linear_top1"] - 20
    meta = json.loads((project / f"artifacts/experiments/{derived}/evaluate/meta.json").read_text())
    assert meta["overrides"] == {"linear_probe": {"epochs": 1, "lr": 1e-6}}
    assert meta["derived_from"] == "tiny_pixels"
    # the features it probes are the preset's: shared, not recomputed under the new id
    assert not (project / f"artifacts/experiments/{derived}/features").exists()
    assert (project / "dvc.lock").read_text() == lock
    # git sees the new run's results only: no plan record, no committed file changed
    status = run(["git", "status", "--porcelain"], project).stdout
    assert status == f"?? results/experiments/{derived}/\n"
    # the same overrides again: the same id, nothing to run
    again = fedssl(project, "run", "tiny_pixels", "linear_probe.lr=1e-6", "linear_probe.epochs=1")
    assert (
        derived_id(again.stderr) == derived and "Nothing to be done" in again.stdout + again.stderr
    )

    # then the how-to's DVC experiment: only the probe reruns, nothing is deleted
    run(["dvc", "exp", "run", "-S", f"{PIXELS}:linear_probe.lr=0.05"], project)
    for folder in ("data/tiny", "partitions/tiny_dir05_m3", "experiments/tiny_simclr/pretrain"):
        assert (project / "artifacts" / folder / "meta.json").is_file(), folder
    assert (project / f"artifacts/experiments/{derived}/evaluate/meta.json").is_file()
    assert metrics(project, derived)["linear_top1"] < committed["linear_top1"] - 20
    # and an override run after it still runs
    fedssl(project, "run", "tiny_pixels", "linear_probe.lr=0.02")
    assert run(["dvc", "status", "--json"], project).stdout.strip() in ("{}", "")


def test_export_and_its_card_read_the_override_run_they_export(project):
    """`fedssl export EXP@<hash>` exports the run it names: its params (one round, not the
    preset's two), its probe metrics, and says what it overrode."""
    sets = ["method.federation.rounds=1", "linear_probe.epochs=1", "linear_probe.lr=1e-6"]
    derived = derived_id(fedssl(project, "run", "tiny_simclr", *sets).stderr)
    assert (project / f"results/experiments/{derived}/rounds.tsv").read_text().count("\n") == 2
    fedssl(project, "export", derived)
    card = json.loads((project / f"artifacts/exports/{derived}/encoder.json").read_text())
    assert card["experiment"] == derived and card["params"]["method"]["federation"]["rounds"] == 1
    overrides = {"method": {"federation": {"rounds": 1}}, "linear_probe": {"epochs": 1, "lr": 1e-6}}
    assert card["derived_from"] == "tiny_simclr" and card["overrides"] == overrides
    assert card["metrics"] == metrics(project, derived) != metrics(project, "tiny_simclr")
    assert f"pretrain__{derived}" in card["trained_by"]  # its own pretraining
    page = (project / f"artifacts/exports/{derived}/MODEL_CARD.md").read_text()
    assert f"An override run of `tiny_simclr`: {json.dumps(overrides, sort_keys=True)}." in page
