"""Reproducible by record: a training stage rerun at the same thread count writes the same bytes;
at another thread count it agrees within float noise; the run record says which it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from fedssl.stage.runtime import cpu
from tests.fixtures import make_tiny_project, run

pytestmark = pytest.mark.timeout(900)

# float32 reductions split over another number of threads round differently, and Adam's two
# rounds here grow that noise by kernel: 1 thread against 2 on a 2-core Zen 4, weights of
# magnitude 0.1-1 differ by at most 1.6e-6 under bf16 with AVX-512 kernels, 5.1e-5 under fp32
# with oneDNN's and ATen's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)
ATOL = 2e-4


def run_pretrain(project, threads: int, keep) -> dict:
    """Run the tiny FedSimCLR pretraining on ``threads`` threads; keep its outputs under
    ``keep``; return its run record."""
    env = {**os.environ, "FEDSSL_THREADS": str(threads), "FEDSSL_DEVICE": "cpu"}
    env.pop("OMP_NUM_THREADS", None)
    if threads > 1:  # as the Snakefile runs a stage given more than one thread
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    proc = subprocess.run(
        [sys.executable, "-m", "stages.method", "pretrain", "tiny_simclr"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.copytree(project / "artifacts/experiments/tiny_simclr/pretrain", keep)
    shutil.copy(project / "results/experiments/tiny_simclr/rounds.tsv", keep / "rounds.tsv")
    return json.loads((project / "artifacts/.runs/pretrain__tiny_simclr.json").read_text())


def test_same_threads_same_bytes_other_threads_within_float_noise(tmp_path):
    project = make_tiny_project(tmp_path / "p", git=False)
    for cmd in (["stages.prepare_data", "tiny"], ["stages.partition", "tiny_dir05_m3"]):
        run([sys.executable, "-m", *cmd], project)
    records = {
        name: run_pretrain(project, threads, tmp_path / name)
        for name, threads in (("one", 1), ("one_again", 1), ("two", 2))
    }
    for name, threads in (("one", 1), ("two", 2)):
        env = records[name]["environment"]
        assert env["torch_threads"] == threads and env["FEDSSL_THREADS"] == str(threads)
        assert env["device"] == "cpu" and env["cpu_count"] == os.cpu_count()
        assert env["cpu_model"] == cpu()["cpu_model"]
        # the outputs' own record says what their numbers depend on: CPU, threads, precision
        meta = json.loads((tmp_path / name / "meta.json").read_text())
        assert meta["precision"] in ("fp32", "bf16")
        # the wait policy, which is not (and differs between front ends), is a run fact
        expected = {"cpu": cpu()["cpu_model"], "vector_extensions": cpu()["cpu_vector_extensions"]}
        expected["threads"] = threads
        if cpu()["cpu_isa_cap"]:  # the suite run with capped kernels
            expected["isa_cap"] = cpu()["cpu_isa_cap"]
        assert meta["computed_on"] == expected
        assert env.get("OMP_WAIT_POLICY") == ("PASSIVE" if threads > 1 else None)

    files = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert "model.pt" in files and "meta.json" in files
    for f in files:  # to the digit: same hardware, same threads
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "one_again" / f).read_bytes(), f

    def weights(name):
        return torch.load(tmp_path / name / "model.pt", weights_only=True)["model"]

    one, two = weights("one"), weights("two")
    assert one.keys() == two.keys()
    for k in one:  # within float noise at another thread count
        assert torch.allclose(one[k].float(), two[k].float(), rtol=0, atol=ATOL), k


@pytest.mark.skipif(os.cpu_count() == 1, reason="torch's default is already one thread")
@pytest.mark.parametrize("torch_first", [True, False], ids=["torch loaded", "torch loaded later"])
def test_fedssl_threads_holds_whenever_the_stage_imports_torch(torch_first):
    """A stage that imports torch only after the runtime set the threads computes on as many
    threads as one that had it loaded: one here, where torch's default is every core."""
    code = (
        "from fedssl.stage.base import set_threads\n"
        + ("import torch\n" if torch_first else "")
        + "set_threads()\nimport torch\nprint(torch.get_num_threads())\n"
    )
    env = {**os.environ, "FEDSSL_THREADS": "1"}
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert proc.stdout.split() == ["1"]


@pytest.mark.skipif(os.cpu_count() == 1, reason="torch's default is already one thread")
@pytest.mark.parametrize(
    ("threads", "computes_on", "wait_policy"),
    [(None, "1", None), ("2", "2", "PASSIVE"), ("0", str(os.cpu_count()), None)],
    ids=["unset: one", "two: idle threads sleep", "0: torch's choice"],
)
def test_a_stage_computes_on_one_thread_unless_told(threads, computes_on, wait_policy):
    """One thread per stage by default (under load a second one waits on a descheduled
    sibling: benchmarks/threads.py); more when asked, with OpenMP's idle threads asleep."""
    code = (
        "import os\nfrom fedssl.stage.base import set_threads\nset_threads()\nimport torch\n"
        "print(torch.get_num_threads(), os.environ.get('OMP_WAIT_POLICY'))\n"
    )
    env = {k: v for k, v in os.environ.items() if "THREADS" not in k and "OMP_" not in k}
    if threads is not None:
        env["FEDSSL_THREADS"] = threads
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert proc.stdout.split() == [computes_on, str(wait_policy)]
