"""Each stage depends on the code it runs, in both front ends: editing a method's report table
module reruns only report stages, editing one paper's cost formulas reruns only the cost stages
that use them (and the reports), and editing the freshness rules or the dvc.yaml writer reruns
nothing. A stage reads its plan record, not the DAG, so editing the planner, adding a data set
or adding an evaluation reruns only the stages whose records change. On a tiny project with
FedSimCLR (costed in MFCL's Tab. 3 conventions) and FedMoCo (an LW-FedSSL-family method:
LW-FedSSL's App. A formulas and Tab. 3 layout)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.fixtures import REPO, make_tiny_project, run, run_and_record
from tests.lwfedssl_fixtures import TINY_PARTITION, tiny_text

pytestmark = pytest.mark.timeout(900)
PIPELINES = ("default", "deps")
REPORTS = {"report__default", "report__deps"}


def planned(project: Path) -> set[str]:
    """Jobs Snakemake dry runs of both pipelines would execute."""
    jobs = set()
    for pipeline in PIPELINES:
        out = run(
            ["snakemake", "-n", "--cores", "1", "--config", f"pipeline={pipeline}"], project
        ).stdout
        jobs |= {m.group(1) for m in re.finditer(r"^(\w+__\w+)\s+\d+$", out, re.M)}
    return jobs


def dvc_stale(project: Path) -> set[str]:
    """Stages of every dvc.yaml that DVC sees changed, but its `dag` check."""
    out = run(["dvc", "status", "--json"], project).stdout
    return {k.split(":")[-1] for k in json.loads(out or "{}")} - {"dag"}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """Both pipelines computed in this process (one torch import), then recorded for DVC as
    the front ends leave it."""
    root = make_tiny_project(tmp_path_factory.mktemp("deps"))
    params = root / "params"
    (params / "partitions" / "tiny_iid_m3_srv.yaml").write_text(TINY_PARTITION)
    (params / "experiments" / "tiny_fedmoco.yaml").write_text(tiny_text("fedmoco"))
    with open(params / "pipelines.yaml", "a") as f:
        f.write("  deps: [tiny_simclr, tiny_fedmoco]\n")
    run(["python", "-m", "fedssl.pipeline", "write", "deps"], root)
    run_and_record(root, PIPELINES)
    return root


def with_files(project: Path, files: dict[str, str]) -> tuple[set[str], set[str]]:
    """(Snakemake's jobs, DVC's stale stages) with ``files`` (path -> text) written into the
    project; they are restored (or removed) after, and both front ends then see nothing to do
    again."""
    paths = {project / file: text for file, text in files.items()}
    good = {path: path.read_text() if path.exists() else None for path in paths}
    try:
        for path, text in paths.items():
            path.write_text(text)
        return planned(project), dvc_stale(project)
    finally:
        for path, text in good.items():
            path.write_text(text) if text is not None else path.unlink()
        assert planned(project) == set() and dvc_stale(project) == set()


def edited(project: Path, *files: str) -> tuple[set[str], set[str]]:
    """:func:`with_files` after appending a comment to each of ``files``."""
    return with_files(project, {f: (project / f).read_text() + "# an edit\n" for f in files})


def test_both_front_ends_start_with_nothing_to_do(project):
    assert planned(project) == set() and dvc_stale(project) == set()


def test_editing_a_table_module_reruns_only_the_reports(project):
    jobs, stale = edited(project, "fedssl/methods/lwfedssl/tables.py")
    assert jobs == stale == {"report__deps"}


@pytest.mark.parametrize(
    "formulas, costs",
    [
        ("fedssl/methods/lwfedssl/paper_costs.py", "costs__tiny_fedmoco"),
        pytest.param(
            "fedssl/costs/end_to_end.py", "costs__tiny_simclr", marks=pytest.mark.slow
        ),  # the same rule for MFCL's Tab. 3 conventions, which FedSimCLR is costed in
    ],
    ids=["LW-FedSSL App. A", "MFCL Tab. 3"],
)
def test_editing_a_papers_cost_formulas_reruns_only_its_costs_and_reports(project, formulas, costs):
    jobs, stale = edited(project, formulas)
    reports = (
        {"report__default", "report__deps"} if costs == "costs__tiny_simclr" else {"report__deps"}
    )
    assert stale == {costs}  # DVC learns about the reports when it has run the costs
    assert jobs == {costs} | reports


def test_editing_the_dvc_writer_or_the_freshness_rules_reruns_nothing(project):
    """All four edited at once: a stage that read any one of them would rerun."""
    planning = ["fedssl/plan/dvcfile.py", "fedssl/plan/freshness.py", "fedssl/plan/cli.py"]
    assert edited(project, *planning, "fedssl/pipeline.py") == (set(), set())


def test_editing_the_planner_reruns_nothing(project):
    """No stage imports the DAG, the import graph or the presets' pipelines: each reads its
    plan record, which an edit that changes no plan leaves as it was."""
    planner = ["fedssl/plan/dag.py", "fedssl/plan/codegraph.py"]
    assert edited(project, *planner) == (set(), set())


def test_editing_the_presets_or_the_params_models_reruns_all_but_the_data_preparation(project):
    """The prepare stage runs by its record alone (its data set's place and reader are in it):
    the presets, the params models and the stage context that loads them are the code of every
    other stage, none of its."""
    records = {p.stem for p in (project / "pipelines/plan").glob("*.json")}
    others = {r for r in records if not r.startswith("prepare_data__")}
    assert records - others == {"prepare_data__tiny"}
    jobs, stale = edited(
        project,
        "fedssl/presets.py",
        "fedssl/params.py",
        "fedssl/stage/context.py",
    )
    assert jobs == stale == others


def test_editing_a_data_sets_file_reruns_its_prepare_stage_and_the_reports(project):
    """A data set's file holds its reader, which its prepare stage runs (named in its record),
    and its entry, whose label the report prints: no other stage reads it (the planner's size
    check asks the reader by name). DVC sees those two changed, and reruns what follows the
    prepare stage only if its data changed; Snakemake's dry run plans all that follows it."""
    jobs, stale = edited(project, "fedssl/data/sets/fashion_mnist.py")
    assert stale == {"prepare_data__tiny"} | REPORTS
    assert {"prepare_data__tiny", "partition__tiny_dir05_m3"} | REPORTS <= jobs


def test_editing_another_data_sets_reader_reruns_nothing(project):
    """The readers are one file per data set: CIFAR-10's, and the torchvision layouts' shared
    code, are no code of a Fashion-MNIST pipeline's stages."""
    files = ("fedssl/data/sets/cifar10.py", "fedssl/data/sets/_torchvision.py")
    assert edited(project, *files) == (set(), set())


STRIPES = """from fedssl.data.sets import DatasetSpec, register

register(DatasetSpec("stripes", "Stripes", 3, (1, 8, 8), 60, "fedssl.data.sets.cifar10:CIFAR10"))
"""


def test_adding_a_data_set_reruns_nothing(project):
    """A data set is a drop-in file the registry finds by name: no stage's code includes it."""
    assert with_files(project, {"fedssl/data/sets/stripes.py": STRIPES}) == (set(), set())


def test_adding_an_evaluation_runs_it_and_reruns_only_the_reports(project):
    """The new stage runs for each partition's experiments; of the stages there were, only the
    reports, whose records now read its metrics, rerun (tests/fl/test_extensions.py's example)."""
    jobs, stale = with_files(
        project,
        {"fedssl/evaluations/client_balance.py": (REPO / "tests/toy_evaluation.py").read_text()},
    )
    new = {j for j in jobs if j.startswith("client_balance__")}
    assert new == {"client_balance__tiny_fedmoco", "client_balance__tiny_pixels"}
    assert jobs - new == REPORTS
    assert stale == REPORTS  # their records changed; DVC gets the new stages on `write`
