"""FedAvg: the weighted mean, summed as the clients finish with the very bits of the stacked
mean, and a round that keeps no client's model once it is added."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest
import torch

from fedssl.fl.cohort import LocalData
from fedssl.fl.state import model_state, nbytes
from fedssl.strategies.aggregation import RunningMean, fedavg
from fedssl.strategies.base import Strategy
from fedssl.strategies.fedavg import FedAvg
from tests.fixtures import REPO
from tests.fl.test_engine import ReadsEveryUpload, make_fed, tiny_model, toy_data
from tests.mkl_dispatch import MKL_AVX2, intel_dispatch_library, on_intel, preloaded


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits, so that -0.0 and 0.0 (and NaNs) compare as the bits they are."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16}
    return t.view(ints[t.dtype]) if t.dtype in ints else t


def uploads(clients: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Client-stacked uploads of every dtype and size a model holds: matrices (with negative
    zeros), a scalar, an integer counter, a float64 and a bfloat16 tensor; and integer data
    sizes. Drawn by numpy: torch's own Gaussian draws depend on the CPU's instruction set."""
    rng = np.random.default_rng(clients)
    normal = rng.standard_normal
    half = (normal((clients, 6), np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
    stack = {
        "conv": torch.from_numpy(normal((clients, 8, 3, 3, 3), np.float32)),
        "bias": torch.from_numpy(np.minimum(normal((clients, 8), np.float32), 0) * 0),
        "alpha": torch.from_numpy(rng.random(clients, np.float32)),
        "count": torch.from_numpy(rng.integers(0, 9, clients)),
        "double": torch.from_numpy(normal((clients, 5))),
        "half": torch.from_numpy(half).to(torch.bfloat16),  # exact: bf16 values
    }
    return stack, torch.from_numpy(rng.integers(1, 900, clients).astype(np.float64))


def ordered_sum(stack: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The mean as both paths must compute it, in numpy: 0 + w_0 v_0 + w_1 v_1 + ... in the
    tensor's dtype (half precision in float32, rounded once at the end), each product rounded,
    then added (two ufuncs: no fused multiply-add); integers: the maximum."""
    if not stack.is_floating_point():
        return stack.max(0).values
    rows = stack.float().numpy() if stack.dtype == torch.bfloat16 else stack.numpy()
    w = weights.numpy() / weights.numpy().sum()  # a sum of integers: exact in any order
    total = np.zeros(rows.shape[1:], rows.dtype)
    for wi, row in zip(w.astype(rows.dtype), rows):
        total = total + wi * row
    return torch.from_numpy(np.asarray(total)).to(stack.dtype)


@pytest.mark.parametrize("clients", [1, 2, 7, 300, 1000])
def test_fedavg_and_the_running_mean_are_the_ordered_sum_bit_for_bit(clients):
    """The stacked mean and the running sum both equal, in every bit, the clients' weighted
    products added in client order from zero: one sequence of correctly rounded elementwise
    operations, so no CPU's choice of kernels can move a bit (a BLAS reduction sums in its own
    order, with or without fused multiply-adds, and so does a blocked dot product)."""
    stack, weights = uploads(clients)
    running = RunningMean(weights)
    for i in range(clients):
        running.add({k: v[i] for k, v in stack.items()})
    for got in (running.result(), fedavg(stack, weights)):
        assert list(got) == list(stack)
        for k, v in stack.items():
            want = ordered_sum(v, weights)
            assert got[k].dtype == v.dtype and torch.equal(bits(got[k]), bits(want)), k


def fedavg_digest() -> str:
    """A digest of fedavg's result on fixed uploads: the same on every CPU."""
    h = hashlib.sha256()
    for clients in (7, 300):
        stack, weights = uploads(clients)
        for k, v in fedavg(stack, weights).items():
            h.update(k.encode() + bits(v).numpy().tobytes())
    return h.hexdigest()


# Instruction-set caps read when torch loads: each makes one library take other kernels than
# this CPU's best (torch's own vectorised kernels, oneDNN's convolutions, MKL's BLAS). MKL runs
# its Intel kernels only on Intel's CPUs: its caps, and its uncapped Intel kernels, run with
# the preloaded library that gives them to any x86 CPU (tests/mkl_dispatch.py).
CAPS = {
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten_default": {"ATEN_CPU_CAPABILITY": "default"},
    "onednn_avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "mkl_avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "mkl_avx512": {"MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "mkl_intel": {},
}


@pytest.fixture(scope="module")
def mkl_intel(tmp_path_factory):
    """The library that gives MKL's Intel kernels to this CPU (None: not needed, on Intel)."""
    if on_intel():
        return None
    library = intel_dispatch_library(tmp_path_factory.mktemp("mkl"))
    if library is None:
        pytest.skip("MKL runs its generic kernels on this CPU; its Intel ones need a C compiler")
    return library


def _capped_env(cap: str, mkl_library) -> dict[str, str]:
    keys = {k for c in CAPS.values() for k in c} | {"LD_PRELOAD"}
    env = {k: v for k, v in os.environ.items() if k not in keys}
    env.update(CAPS[cap], PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return preloaded(env, mkl_library) if cap.startswith("mkl") and mkl_library else env


@pytest.mark.parametrize("cap", sorted(CAPS))
def test_the_bit_for_bit_checks_hold_with_the_kernels_of_a_capped_instruction_set(
    tmp_path, cap, request
):
    """Another CPU picks other kernels: the ordered-sum check and a FedAvg round streamed
    against stacked, run in a process whose instruction sets are capped (or that takes MKL's
    Intel kernels), pass there, and fedavg's result on fixed uploads has the very bits it has
    here."""
    library = request.getfixturevalue("mkl_intel") if cap.startswith("mkl") else None
    proc = subprocess.run(
        [sys.executable, "-m", "tests.strategies.fedavg_kernels", str(tmp_path)],
        cwd=REPO, env=_capped_env(cap, library), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = json.loads(proc.stdout.splitlines()[-1])
    assert ran["digest"] == fedavg_digest()
    want = CAPS[cap].get("ATEN_CPU_CAPABILITY", "").upper()
    if want == "DEFAULT" or want and torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert ran["capability"] == want  # the cap took: torch runs its other kernels
    if cap.startswith("mkl") and ran["mkl_isa"] is not None:
        assert ran["mkl_isa"] > 0  # MKL ran vectorised Intel kernels, not its generic ones
    if cap == "mkl_avx2" and ran["mkl_isa"] is not None:
        assert ran["mkl_isa"] <= MKL_AVX2  # the cap took


def held(running: RunningMean) -> int:
    """The bytes a running mean holds: its sums and maxima."""
    return nbytes(running.sums) + nbytes(running.maxima)


def test_a_running_mean_of_a_batchnorm_model_holds_one_models_worth():
    """Weights and BatchNorm's integer batch counter: after 3 or 300 clients the sums hold the
    same bytes, one model's (a counter per client kept until the end would grow with them)."""
    upload = {"w": torch.ones(4, 3), "b": torch.ones(3), "num_batches_tracked": torch.tensor(5)}
    sizes = []
    for clients in (3, 300):
        running = RunningMean(torch.ones(clients, dtype=torch.float64))
        for i in range(clients):
            running.add({**upload, "num_batches_tracked": torch.tensor(clients - i)})
        sizes.append(held(running))
        assert running.result()["num_batches_tracked"] == clients  # the first client's
    assert sizes == [nbytes(upload)] * 2


def test_running_mean_counts_its_uploads():
    running = RunningMean(torch.tensor([1.0, 2.0], dtype=torch.float64))
    running.add({"w": torch.ones(3)})
    with pytest.raises(ValueError, match="1 uploads added, 2 weights"):
        running.result()
    running.add({"w": torch.ones(3)})
    with pytest.raises(ValueError, match="more uploads than the 2 weights"):
        running.add({"w": torch.ones(3)})


def test_only_strategies_that_keep_fedavgs_aggregate_stream():
    cfg = None
    assert not FedAvg(cfg).needs_uploads() and not Strategy(cfg).needs_uploads()
    assert ReadsEveryUpload(cfg).needs_uploads()
    patched = FedAvg(cfg)
    patched.aggregate = lambda state, updates: None  # a test's own rule on one instance
    assert patched.needs_uploads()


@pytest.mark.parametrize("parallel", [False, True])
def test_a_fedavg_round_is_the_stacked_rounds_model_and_keeps_no_upload(tmp_path, parallel):
    """One round of FedAvg streams (no upload kept, the mean in ``updates.mean``) and gives the
    model of the stacked path bit for bit, on both cohort paths."""
    data = toy_data()
    models = {}
    for strategy in (FedAvg, ReadsEveryUpload):
        model = tiny_model()
        fed = make_fed(
            model, data, tmp_path / strategy.__name__, parallel=parallel, strategy=strategy
        )
        state = fed.start(model)
        updates = fed.trainer.train_round(fed, state, [0, 1, 2], 0, 1e-3)
        assert (updates.mean is None) == (strategy is ReadsEveryUpload)
        assert len(updates.uploads) == (3 if strategy is ReadsEveryUpload else 0)
        fed.strategy.aggregate(state, updates)
        models[strategy] = state.server["global"]
    for k, v in models[ReadsEveryUpload].items():
        assert torch.equal(bits(models[FedAvg][k]), bits(v)), k


class WatchesUploads:
    """Mixed into a strategy: at each client's upload, the bytes of the client models the round
    still holds (the tensors every upload so far lives in, a cohort row's base), followed by
    weak reference so that watching keeps none of them alive."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.homes: list[weakref.ref] = []
        self.peak = 0

    def upload(self, state, client, trained):
        out = super().upload(state, client, trained)
        self.homes += [weakref.ref(v if v._base is None else v._base) for v in out.values()]
        alive = {id(t): t for t in (home() for home in self.homes) if t is not None}
        self.peak = max(self.peak, sum(t.nbytes for t in alive.values()))
        return out


class WatchedFedAvg(WatchesUploads, FedAvg):
    pass


class WatchedEveryUpload(WatchesUploads, ReadsEveryUpload):
    pass


def test_a_fedavg_round_holds_one_client_model_whatever_the_client_count(tmp_path):
    """Memory O(model), not O(clients): clients trained one at a time (the CPU's cohort), a
    FedAvg round holds one client's trained model at any time, with 3 clients as with 12,
    while a strategy that reads every upload holds all of them; both give the same model bit
    for bit. (The vectorised cohort trains every client at once, so it holds them all.)"""
    images = toy_data(n=96).images
    size = nbytes(model_state(tiny_model()))
    models = {}
    for clients in (3, 12):
        data = LocalData(images, torch.arange(96) % 3, np.array_split(np.arange(96), clients))
        for strategy in (WatchedFedAvg, WatchedEveryUpload):
            model = tiny_model()
            fed = make_fed(
                model, data, tmp_path / f"{strategy.__name__}{clients}", strategy=strategy
            )
            state = fed.start(model)
            fed.run_round(state)
            held = fed.strategy.peak
            assert held == (size if strategy is WatchedFedAvg else clients * size), (clients, held)
            models[strategy, clients] = state.server["global"]
    for clients in (3, 12):
        stacked_model = models[WatchedEveryUpload, clients]
        for k, v in models[WatchedFedAvg, clients].items():
            assert torch.equal(bits(v), bits(stacked_model[k])), (clients, k)
