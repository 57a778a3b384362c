"""The dress rehearsal (tests/rehearsal.py): its overlay and choice of experiments, one paper
experiment per method family run end to end in the default suite, and every paper pipeline
through Snakemake behind the opt-in marker ``rehearsal`` (``make rehearse``)."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import pytest

from fedssl.data.catalog import dataset_spec
from fedssl.methods import registry
from fedssl.presets import Presets
from tests.fixtures import REPO
from tests.rehearsal import (
    IMAGES,
    build,
    choose,
    in_process,
    overlay,
    paper_pipelines,
    representatives,
    shape,
    snakemake,
)

PRESETS = Presets(REPO / "params")
PAPER_PIPELINES = paper_pipelines(PRESETS)


def test_overlay_caps_counts_and_keeps_the_architecture():
    params = {
        "rounds": 800,
        "client_fraction": 0.1,
        "phase1": {"rounds": 15, "local_epochs": 3, "batch_pairs": 64, "lr": 0.05},
        "rserver": {"epochs": 150, "warmup_epochs": 10, "width": 64, "proj_hidden": 512},
        "cfl": {"encoder_epochs": None, "head_epochs": 10, "global_encoder": True},
        "vit": {"width": 192, "depth": 12, "patch_size": 4, "input_size": 32},
        "settings": [{"iterations": 300, "label": "full"}],
        "num_clients": 100,
        "subset": 20000,
    }
    assert overlay(params) == {
        "rounds": 1,
        "client_fraction": 0.1,
        "phase1": {"rounds": 1, "local_epochs": 1, "batch_pairs": 8, "lr": 0.05},
        "rserver": {"epochs": 1, "warmup_epochs": 0, "width": 64, "proj_hidden": 512},
        "cfl": {"encoder_epochs": None, "head_epochs": 1, "global_encoder": True},
        "vit": {"width": 192, "depth": 12, "patch_size": 4, "input_size": 32},
        "settings": [{"iterations": 2, "label": "full"}],
        "num_clients": 6,
        "subset": None,
    }
    assert overlay({"rounds": 0})["rounds"] == 0  # a cap, never a raise


def test_one_experiment_per_shape_the_last_of_each():
    names = PRESETS.pipeline_experiments("paper_cifar10_mocosfl")
    assert len(names) > 1 and len({shape(PRESETS, n) for n in names}) == 1
    assert representatives(PRESETS, "paper_cifar10_mocosfl") == [names[-1]]
    assert representatives(PRESETS, "paper_cifar10_mocosfl", every=True) == names
    # MFCL, FedSimCLR, supervised and FSL on CIFAR-10: four methods, four shapes
    chosen = representatives(PRESETS, "paper_cifar10_mfcl")
    methods = [PRESETS.load("experiment", n).method.name for n in chosen]
    assert sorted(methods) == ["fedsimclr", "fsl", "mfcl", "supervised"]


def test_every_rehearsal_experiment_validates_and_plans(tmp_path):
    """The overlay leaves every representative of every paper pipeline valid, with its
    pipeline's stages planned in the rehearsal project (no data read, nothing run)."""
    from fedssl.plan.dag import Dag
    from tests.fixtures import in_project

    chosen = choose(PRESETS, PAPER_PIPELINES)
    build(tmp_path, chosen, images=IMAGES)
    with in_project(tmp_path):
        for pipeline, names in chosen.items():
            dag = Dag(pipeline)
            assert dag.experiments == names
            for name in names:  # the paper's network and resolution are kept
                exp = Presets().load("experiment", name)
                original = PRESETS.load("experiment", name)
                assert shape(Presets(), name) == shape(PRESETS, name)
                assert exp.method.model_dump().keys() == original.method.model_dump().keys()


def test_the_report_labels_every_paper_partition():
    """Found by the rehearsal: FEMNIST's cyclic partition had no column label in the report."""
    from fedssl.reporting.report import table_cell

    for pipeline in PAPER_PIPELINES:
        for name in PRESETS.pipeline_experiments(pipeline):
            exp = PRESETS.load("experiment", name)
            part = PRESETS.load("partition", exp.partition)
            method = registry.get(exp.method.name)
            dataset = PRESETS.load("dataset", part.dataset).name
            assert table_cell(exp, method, part, dataset)[1].startswith(dataset_spec(dataset).label)
    femnist = PRESETS.load("partition", "femnist_c3_m150")
    exp = PRESETS.load("experiment", "paper_mpf_mpfedcon_femnist")
    cell = table_cell(exp, registry.get("mpfedcon"), femnist, "femnist")
    assert cell[1] == "FEMNIST 3 classes/client"


def _family(method: str) -> str:
    """A method's family: the module (or package) of the methods package that declares it."""
    return registry.module_of(method).removeprefix("fedssl.methods.").split(".")[0]


@functools.cache
def _cheapest_by_family() -> dict[str, tuple[str, str]]:
    """Family -> (paper pipeline, experiment): the representative on the smallest images."""
    found: dict[str, tuple] = {}
    for pipeline, names in choose(PRESETS, PAPER_PIPELINES).items():
        for name in names:
            exp = PRESETS.load("experiment", name)
            dataset = PRESETS.load("partition", exp.partition).dataset
            c, h, w = dataset_spec(PRESETS.load("dataset", dataset).name).shape
            key = (c * h * w, len(names))
            family = _family(exp.method.name)
            if family not in found or key < found[family][0]:
                found[family] = (key, pipeline, name)
    return {f: (p, n) for f, (_, p, n) in found.items()}


FAMILIES = sorted({_family(m.name) for m in registry.all()} - {"none"})


@pytest.mark.timeout(1800)  # 15-60 s of CPU each; far longer in wall time on a busy machine
@pytest.mark.parametrize("family", FAMILIES)
def test_a_paper_experiment_of_each_method_family_runs(tmp_path, family, one_thread):
    """The cheapest paper experiment of the family runs every stage of its pipeline (report
    included) on the fixtures, in this process; each stage leaves its meta.json."""
    cheapest = _cheapest_by_family()
    if family not in cheapest:
        pytest.skip(f"no paper pipeline runs a method of {family}")
    pipeline, name = cheapest[family]
    build(tmp_path, {pipeline: [name]}, images=IMAGES)
    in_process(tmp_path, pipeline)
    _check_ran(tmp_path, pipeline, [name])


def _check_ran(root: Path, pipeline: str, names: list[str]) -> None:
    from fedssl.plan.dag import Dag
    from tests.fixtures import in_project

    with in_project(root):
        dag = Dag(pipeline)
        missing = [s.name for s in dag.stages.values() if not (Path(s.out) / "meta.json").exists()]
        report = json.loads(Path(f"results/reports/{pipeline}/report.json").read_text())
    assert not missing, f"stages that left no meta.json: {missing}"
    assert [row["experiment"] for row in report["rows"]] == names


def _opted_in(config) -> bool:
    return "rehearsal" in (config.getoption("markexpr") or "")


@pytest.mark.rehearsal
@pytest.mark.timeout(0)  # hours on a small CPU: paper_mfcl_tab2 has 26 shapes
@pytest.mark.parametrize("pipeline", PAPER_PIPELINES)
def test_paper_pipeline_rehearsal(tmp_path, pipeline, request):
    """The pipeline's representatives through Snakemake on the fixtures (opt-in)."""
    if not _opted_in(request.config):
        pytest.skip("opt-in: make rehearse (pytest -m rehearsal)")
    chosen = choose(PRESETS, [pipeline])
    build(tmp_path, chosen)
    start = time.perf_counter()
    proc = snakemake(tmp_path, pipeline, "all")
    assert proc.returncode == 0, f"{pipeline}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    print(f"{pipeline}: {len(chosen[pipeline])} experiments, {time.perf_counter() - start:.0f} s")
    _check_ran(tmp_path, pipeline, chosen[pipeline])
