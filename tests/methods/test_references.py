"""A name that points at no preset is reported with the file (and field) that holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedssl.params import ParamsError
from tests.fixtures import in_project, make_tiny_project

# (the file that refers, the reference as it is, the broken one, the message's start)
BROKEN = [
    (
        "params/experiments/tiny_random.yaml",
        "partition: tiny_dir05_m3",
        "partition: nope",
        "params/experiments/tiny_random.yaml: partition: no preset 'nope' in "
        "params/partitions or params/grids.yaml",
    ),
    (
        "params/partitions/tiny_dir05_m3.yaml",
        "dataset: tiny",
        "dataset: nope",
        "params/partitions/tiny_dir05_m3.yaml: dataset: no preset 'nope' in params/datasets",
    ),
    (
        "params/pipelines.yaml",
        "tiny_pixels]",
        "nope]",
        "params/pipelines.yaml: pipelines.default: no preset 'nope' in "
        "params/experiments or params/grids.yaml",
    ),
]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_tiny_project(tmp_path_factory.mktemp("refs"), git=False)


@pytest.mark.parametrize("file, good, bad, message", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_missing_reference_names_the_file_that_made_it(project, file, good, bad, message):
    from fedssl.plan.dag import Dag

    path = project / file
    text = path.read_text()
    try:
        path.write_text(text.replace(good, bad))
        with in_project(project), pytest.raises(ParamsError) as err:
            Dag("default")
        assert str(err.value) == message
    finally:
        path.write_text(text)
    with in_project(project):
        assert Path(Dag("default").stages["report__default"].out).name == "default"
