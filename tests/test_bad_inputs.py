"""Every bad input of issue 37 is refused at planning, before any stage, with the file and the
field named: the table below is every one tried (the params of a tiny project: a 240-image
data set, 3 Dirichlet clients, FedSimCLR for 2 rounds). Planning is what both front ends run
first (the Snakefile builds the DAG; `dvc repro` starts with the `dag` stage, which builds it
too); two of them are also run through both front ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedssl.params import ParamsError
from tests.fixtures import in_project, make_tiny_project, run

EXPERIMENT = "params/experiments/tiny_simclr.yaml"
PARTITION = "params/partitions/tiny_dir05_m3.yaml"

# name -> (file, {text: its replacement}, what the refusal says besides the file)
BAD_INPUTS = {
    "rounds: yes (YAML boolean, read as 1)": (
        EXPERIMENT,
        {"rounds: 2": "rounds: yes"},
        "rounds: True is a yes/no value",
    ),
    "rounds: 0 (no training)": (EXPERIMENT, {"rounds: 2": "rounds: 0"}, "rounds: Input should be"),
    "rounds: 1000000000000 (a run that never ends)": (
        EXPERIMENT,
        {"rounds: 2": "rounds: 1000000000000"},
        "less than or equal to 100000",
    ),
    "duplicate key (Snakemake kept the last, DVC refused)": (
        EXPERIMENT,
        {"    lr: 0.001\n": "    lr: 0.001\n    lr: 0.003\n"},
        "found the key 'lr' twice",
    ),
    "lr: .inf": (EXPERIMENT, {"lr: 0.001": "lr: .inf"}, "lr: Input should be a finite number"),
    "client_fraction: .nan": (
        EXPERIMENT,
        {"client_fraction: 1.0": "client_fraction: .nan"},
        "client_fraction: Input should be a finite number",
    ),
    "batch_size: on": (EXPERIMENT, {"batch_size: 32": "batch_size: on"}, "batch_size: True is a"),
    "crop_scale: [yes, 1.0]": (
        EXPERIMENT,
        {"crop_scale: [0.5, 1.0]": "crop_scale: [yes, 1.0]"},
        "crop_scale: [True, 1.0] is a yes/no value",
    ),
    "knn k: 100000 on 240 images (was clamped)": (
        EXPERIMENT,
        {"knn: {k: 5": "knn: {k: 100000"},
        "knn.k: 100000 neighbours but the bank holds 240 training images",
    ),
    "knn k above features.train_size": (
        EXPERIMENT,
        {"knn: {k: 5": "knn: {k: 150", "train_size: null": "train_size: 100"},
        "knn.k: 150 neighbours but the bank holds 100",
    ),
    "Dirichlet alpha: .inf": (
        PARTITION,
        {"alpha: 0.5": "alpha: .inf"},
        "alpha: Input should be a finite number",
    ),
    "num_clients above the data set's samples": (
        PARTITION,
        {"num_clients: 3": "num_clients: 1000"},
        "num_clients: 1000 clients but only 240 samples",
    ),
    "num_clients above the subset's samples": (
        PARTITION,
        {"num_clients: 3": "num_clients: 150", "subset: null": "subset: 100"},
        "num_clients: 150 clients but only 100 samples",
    ),
    "partition seed: no": (PARTITION, {"seed: 0": "seed: no"}, "seed: False is a yes/no value"),
    "a misspelt key": (PARTITION, {"seed: 0": "sead: 0"}, "Extra inputs are not permitted"),
    "probe epochs: 0": (EXPERIMENT, {"epochs: 5": "epochs: 0"}, "linear_probe.epochs"),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_tiny_project(tmp_path_factory.mktemp("bad_inputs"))


def edit(project: Path, file: str, edits: dict[str, str]) -> str:
    """Apply ``edits`` to ``file`` of the project; returns its text before."""
    path = project / file
    good = text = path.read_text()
    for old, new in edits.items():
        assert old in text, (file, old)
        text = text.replace(old, new, 1)
    path.write_text(text)
    return good


@pytest.mark.parametrize("bad", BAD_INPUTS)
def test_a_bad_input_is_refused_at_planning_naming_the_file_and_field(project, bad):
    from fedssl.plan.dag import Dag

    file, edits, said = BAD_INPUTS[bad]
    good = edit(project, file, edits)
    try:
        with in_project(project), pytest.raises(ParamsError) as refused:
            Dag("default")
    finally:
        (project / file).write_text(good)
    message = str(refused.value)
    assert message.startswith(file) and said in message, message


@pytest.mark.parametrize("bad", ["rounds: yes (YAML boolean, read as 1)", "lr: .inf"])
def test_both_front_ends_refuse_before_any_stage(project, bad):
    file, edits, said = BAD_INPUTS[bad]
    good = edit(project, file, edits)
    try:
        for cmd in (["snakemake", "--cores", "1"], ["dvc", "repro"]):
            proc = run(cmd, project, check=False)
            out = proc.stdout + proc.stderr
            assert proc.returncode != 0 and file in out and said in out, (cmd, out[-2000:])
            assert not (project / "artifacts/data").exists(), cmd  # no stage ran
    finally:
        (project / file).write_text(good)


def test_a_partition_leaving_a_client_empty_is_refused_naming_the_file_and_the_fix(tmp_path):
    """A Dirichlet draw that leaves a client without samples (where min_per_client is 0) stops
    the partition stage, before any training stage can fail inside torch on it."""
    from fedssl.stage.context import StageFailed
    from stages import partition, prepare_data

    root = make_tiny_project(tmp_path, git=False)
    edits = {"num_clients: 3": "num_clients: 60", "alpha: 0.5": "alpha: 0.01"}
    edit(root, PARTITION, {**edits, "min_per_client: 20": "min_per_client: 0"})
    with in_project(root):
        prepare_data.run(["tiny"])
        with pytest.raises(StageFailed) as refused:
            partition.run(["tiny_dir05_m3"])
    message = str(refused.value)
    assert message.startswith(f"{PARTITION}: scheme: client(s) [")
    assert "got no samples: set scheme.min_per_client" in message
