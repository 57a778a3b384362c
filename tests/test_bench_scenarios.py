"""`make bench`'s step scenarios (benchmarks/step_limits.py) build and step on the current code:
a method's refactor that breaks a scenario fails here, not in the next bench run."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest
from torch.utils.flop_counter import FlopCounterMode

from fedssl import precision
from tests.fixtures import REPO


def step_limits():
    spec = importlib.util.spec_from_file_location("step_limits", REPO / "benchmarks/step_limits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("scenario", list(step_limits().SCENARIOS))
def test_each_step_scenario_builds_steps_and_counts_its_flops(scenario, monkeypatch):
    monkeypatch.chdir(REPO)  # the scenarios read the smoke presets
    make = step_limits().SCENARIOS[scenario]()
    with precision.policy("fp32"):
        step, images, counted = make()
        step()
        with FlopCounterMode(display=False) as flops:
            counted()
    assert images > 0
    assert flops.get_total_flops() > images * 1e5  # a real network's step, per image


@pytest.mark.parametrize("scenario", ["simclr_cnn", "personalised_cnn"])
def test_the_fp32_layout_benchmark_compares_the_same_step(scenario, monkeypatch):
    """benchmarks/fp32_layout.py: the contiguous and the channels-last step are one computation
    (the same losses over three steps, up to fp32 rounding), laid out differently."""
    import torch

    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # it imports step_limits by name
    spec = importlib.util.spec_from_file_location("fp32_layout", REPO / "benchmarks/fp32_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    contiguous, last = (
        module.make_step(*module.SCENARIOS[scenario](), layout) for layout in (False, True)
    )
    a, b = [contiguous() for _ in range(3)], [last() for _ in range(3)]
    torch.testing.assert_close(torch.stack(a), torch.stack(b), rtol=1e-4, atol=1e-5)


def flower_peer():
    spec = importlib.util.spec_from_file_location("flower_peer", REPO / "benchmarks/flower_peer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_peer_benchmark_samples_the_whole_process_tree():
    """The Flower side is many processes (Ray's raylet, GCS, workers): a child's memory and CPU
    count, and a process gone before the end keeps the peak it reached."""
    import subprocess
    import sys

    hog = "import time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
    hog += "time.sleep(1.5)"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {hog!r}])",
        ]
    )
    sampler = flower_peer().TreeSampler(parent.pid, every=0.05)
    sampler.start()
    parent.wait()
    sampler.done.set()
    sampler.join()
    assert sampler.peak_mb > 300  # the grandchild's 300 MB, touched page by page
    assert sampler.peak_mb < 1000
    assert len(sampler.cpu) >= 2  # parent and child both seen


def test_our_side_of_the_peer_benchmark_runs_the_default_fedsimclr(monkeypatch):
    monkeypatch.chdir(REPO)
    result = flower_peer().run_ours(clients=4, images=200, rounds=2, setting="fp32")
    assert len(result["seconds"]) == 2 and all(s > 0 for s in result["seconds"])
    assert result["precision"] == "fp32"
    # the start and each round's end, where the sampler reads the tree's CPU
    assert len(result["stamps"]) == 3 and sorted(result["stamps"]) == result["stamps"]


def test_a_flower_client_loads_its_data_set_once_per_process(monkeypatch):
    """The Flower side's clients reuse one data set per Ray worker, as a Flower app does: it
    is never rebuilt (nor shipped) per message."""
    monkeypatch.chdir(REPO)
    peer = flower_peer()
    first = peer.local_data(200, 4)
    assert peer.local_data(200, 4) is first
    assert [len(s) for s in first["shares"]] == [50, 50, 50, 50]
    assert peer.local_data.cache_info().misses == 1


def test_a_cpu_without_native_bf16_times_no_emulated_bf16(monkeypatch):
    """One emulated bf16 2048^2 product took over a minute on a CPU without AVX-512 BF16:
    there the peak is fp32's alone, and the machine line says why."""
    module = step_limits()
    monkeypatch.setattr(precision, "native_bf16", lambda device_type: False)
    assert list(module.matmul_contenders()) == ["fp32"]
    monkeypatch.setattr(precision, "native_bf16", lambda device_type: True)
    assert list(module.matmul_contenders()) == ["fp32", "bf16"]


def test_the_machine_line_names_the_cpu_and_its_vector_extensions(monkeypatch):
    from fedssl.stage import runtime

    zen3 = {
        "model name": "AMD EPYC 7B13",
        "cpu family": "25",
        "model": "1",
        "flags": "fpu sse4_2 avx fma avx2 bmi2 sha_ni",
    }
    for name in runtime.ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runtime, "_cpuinfo", lambda: zen3)
    runtime.cpu.cache_clear()
    try:
        assert runtime.cpu() == {
            "cpu_model": "AMD EPYC 7B13 (family 25, model 1)",
            "cpu_vector_extensions": ["sse4_2", "avx", "fma", "avx2"],
            "cpu_native_bf16": False,
            "cpu_isa_cap": "",
        }
        assert runtime.cpu_summary().startswith("AMD EPYC 7B13 (family 25, model 1), ")
        assert runtime.cpu_summary().endswith("sse4_2 avx fma avx2 (no native bf16)")
        # a Zen 4 capped to AVX2 says so, and that its bf16 is then not native
        zen4 = {**zen3, "model": "17", "flags": zen3["flags"] + " avx512f avx512_bf16"}
        monkeypatch.setattr(runtime, "_cpuinfo", lambda: zen4)
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
        runtime.cpu.cache_clear()
        assert not runtime.cpu()["cpu_native_bf16"]
        assert runtime.cpu_summary().endswith(
            "avx512_bf16 (no native bf16; kernels capped: ONEDNN_MAX_CPU_ISA=AVX2)"
        )
        assert runtime.computed_on()["isa_cap"] == "ONEDNN_MAX_CPU_ISA=AVX2"
    finally:
        runtime.cpu.cache_clear()


def _session_members(sid: int) -> int:
    """How many live processes belong to session ``sid`` (from /proc)."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        count += fields[0] != "Z" and int(fields[3]) == sid
    return count


@pytest.mark.parametrize("layout", ["one", "own"])
def test_the_load_benchmark_puts_its_busy_loops_in_the_sessions_it_says(layout):
    """`run_under_load.py`: "one" is one other user's 2 jobs (a session holding both loops),
    "own" is two users (a session each); stopping the load leaves no loop behind."""
    spec = importlib.util.spec_from_file_location("rul", REPO / "benchmarks/run_under_load.py")
    run_under_load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_under_load)
    procs = run_under_load.start_load(2, layout)
    try:
        time.sleep(1.0)
        sids = {os.getsid(p.pid) for p in procs}
        assert sids == {p.pid for p in procs} and os.getsid(0) not in sids
        members = [_session_members(s) for s in sids]
        assert members == ([3] if layout == "one" else [1, 1])
    finally:
        run_under_load.stop_load(procs)
    assert all(_session_members(s) == 0 for s in sids)


def test_each_line_is_paired_with_the_untrained_line_of_its_own_encoder(
    tmp_path, monkeypatch, capsys
):
    """`board_vs_twin.py`: MFCL's line against its stem at init, not against the small CNN's
    random init; a line with no twin on its encoder is left out."""
    import json

    spec = importlib.util.spec_from_file_location("bvt", REPO / "benchmarks/board_vs_twin.py")
    bvt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bvt)

    def row(name, line, arch, rounds, acc):
        return {"experiment": name, "row": line, "arch": arch, "column": "P", "rounds": rounds,
                "linear_top1": acc, "knn_top1": acc}  # fmt: skip

    rows = [row(f"cnn_init_p_s{s}", "init", "cnn", 0, 70.0) for s in (0, 1)]
    rows += [row(f"stem_init_p_s{s}", "stem at init", "stem", 0, 60.0 + s) for s in (0, 1)]
    rows += [row(f"mfcl_p_s{s}", "MFCL", "stem", 50, 55.0 + 3 * s) for s in (0, 1)]
    rows += [row(f"vit_p_s{s}", "ViT line", "vit", 15, 65.0) for s in (0, 1)]
    (tmp_path / "results/reports/b").mkdir(parents=True)
    (tmp_path / "results/reports/b/report.json").write_text(json.dumps({"rows": rows}))
    monkeypatch.chdir(tmp_path)
    bvt.main("b")
    lines = capsys.readouterr().out.splitlines()[2:]
    assert [ln.split("\t")[:5] for ln in lines] == [
        ["MFCL", "P", m, "2", "-5.00 -3.00"] for m in ("linear_top1", "knn_top1")
    ]


def test_the_client_overhead_benchmark_times_functions_the_engine_has():
    """benchmarks/client_overhead.py times a round by part around named engine functions: a
    function that moved or was renamed fails here, not as a part silently timed at zero."""
    spec = importlib.util.spec_from_file_location(
        "client_overhead", REPO / "benchmarks/client_overhead.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for mod, owner, attr in module.PARTS.values():
        holder = importlib.import_module(mod)
        holder = getattr(holder, owner) if owner else holder
        assert callable(vars(holder).get(attr)), (mod, owner, attr)


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs to pin apart",
)
def test_the_peer_benchmark_runs_the_measured_tree_on_a_cpu_apart_from_its_sampler(monkeypatch):
    """The runs go to the CPU named when the benchmark starts, not to one the sampler (which
    has moved itself to the other CPUs by then) shares."""
    import argparse

    monkeypatch.chdir(REPO)
    bench, before = flower_peer(), os.sched_getaffinity(0)
    cpu = bench.measured_cpu()
    try:
        os.sched_setaffinity(0, before - {cpu})  # as the benchmark's main() moves itself
        args = argparse.Namespace(
            images=64, rounds=2, precision="fp32", compile="off", peer_precision="fp32", cpu=cpu
        )
        run = bench.measure("ours", 2, args)
    finally:
        os.sched_setaffinity(0, before)
    assert run["cpus"] == [cpu]
