"""Kill and resume for every long stage kind that test_safety does not cover: CP-CFL's server
`pretrain` and `cfl`, an LW-FedSSL growth stage, MpFedcon's personalised `train` (FedRep and
MpFedcon variants), the shared `finetune` stage and the gradient-leakage `attack`.

Each test runs the stage uninterrupted, then again in a child process that is SIGKILLed as soon
as its first checkpoint is on disk, then once more: the third run must say it resumes and leave
every output file (the stage's artifact folder and the experiment's results) byte-identical to
the uninterrupted run's, with its checkpoint gone. The uninterrupted and resumed runs happen in
this process (one torch import), the killed one in a child; all on one thread. The MpFedcon
variant and IFCA's warm-up run only with `-m slow`: FedRep and CP-CFL's pool cover their stage
kinds in the default suite."""

from __future__ import annotations

import pytest

from tests.fixtures import assert_a_killed_stage_resumes, make_tiny_project
from tests.lwfedssl_fixtures import TINY_PARTITION as LW_PARTITION
from tests.lwfedssl_fixtures import TINY_SCRATCH
from tests.lwfedssl_fixtures import tiny_text as lw_text
from tests.methods.cpcfl.test_cpcfl import add_tiny_cpcfl
from tests.methods.mpfedcon.test_mpfedcon_chain import EXPERIMENT as MPF_EXPERIMENT
from tests.methods.mpfedcon.test_mpfedcon_chain import LEAKAGE
from tests.methods.mpfedcon.test_mpfedcon_chain import PARTITION as SHARDS

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.timeout(600)]

LW_GROW_S2_LONG = lw_text("lw_fedssl").replace(
    "  calibration: {enabled: true, timing: round_start}\n",
    "  calibration: {enabled: true, timing: round_start}\n  stages: {s2: {rounds: 3}}\n",
)
LEAKAGE_SMALL = LEAKAGE.replace("label_images: 6", "label_images: 2").replace(
    "recon_label_images: 2", "recon_label_images: 1"
)
SCRATCH_FINETUNE_LONG = TINY_SCRATCH.replace("finetune: {epochs: 2,", "finetune: {epochs: 3,")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = make_tiny_project(tmp_path_factory.mktemp("resume_stages"), git=False)
    add_tiny_cpcfl(root)
    params = root / "params"
    (params / "partitions" / "tiny_iid_m3_srv.yaml").write_text(LW_PARTITION)
    (params / "experiments" / "tiny_lw_long.yaml").write_text(LW_GROW_S2_LONG)
    (params / "partitions" / "tiny_shards.yaml").write_text(SHARDS)
    for variant in ("fedrep", "mpfedcon"):
        (params / "experiments" / f"tiny_{variant}.yaml").write_text(
            MPF_EXPERIMENT.format(variant=variant, seed=0)
        )
    (params / "experiments" / "tiny_leakage.yaml").write_text(LEAKAGE_SMALL)
    (params / "experiments" / "tiny_scratch_ft.yaml").write_text(SCRATCH_FINETUNE_LONG)
    return root


@pytest.mark.parametrize(
    "kind, exp, first_work",
    [
        # what the uninterrupted run prints first and a resumed one must not redo
        pytest.param("pretrain", "tiny_cpcfl", "width 16 epoch 1/", id="cpcfl-server-pretrain"),
        pytest.param("cfl", "tiny_cpcfl", "cfl round 1/", id="cpcfl-cfl"),
        pytest.param(
            "cfl",
            "tiny_ifca_fedavg",
            "FedAvg warm-up round 1/",
            id="cpcfl-cfl-warmup",
            marks=pytest.mark.slow,
        ),  # killed in IFCA's FedAvg warm-up, before the pool
        pytest.param("grow_2", "tiny_lw_long", "round 1/", id="lwfedssl-growth-stage"),
        pytest.param("train", "tiny_fedrep", "round 1/", id="personal-fedrep"),
        pytest.param(
            "train", "tiny_mpfedcon", "round 1/", id="personal-mpfedcon", marks=pytest.mark.slow
        ),  # the stage kind of the one above
        pytest.param("finetune", "tiny_scratch_ft", "epoch 1/", id="finetune"),
        pytest.param("attack", "tiny_leakage", "setting full: cl=", id="gradient-leakage"),
    ],
)
def test_a_killed_stage_resumes_to_the_uninterrupted_outputs(
    project, kind, exp, first_work, capsys, monkeypatch
):
    assert_a_killed_stage_resumes(project, kind, exp, first_work, capsys, monkeypatch)
