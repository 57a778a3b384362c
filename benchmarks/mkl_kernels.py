"""Which kernels MKL runs, and what they do to a weighted mean's bits: on a CPU that is not
Intel's MKL runs its generic kernels whatever the instruction set; preloading the library of
``tests/mkl_dispatch.py`` gives it the Intel kernels an Intel user's machine runs. Each line is
a fresh process (MKL reads its dispatch once): MKL's instruction-set level (0 generic, 5 AVX2,
7 AVX-512) and a digest of a float32 weighted mean of 300 rows of 50,000 numbers, once as a
BLAS product (``w @ stack``, the mean ``fedavg`` once computed) and once as the library's
``fedavg`` (the running sum in client order). The first differs by kernels, the second must
not.

    python benchmarks/mkl_kernels.py
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {  # name -> (MKL's Intel kernels preloaded, environment)
    "generic (MKL's own choice here)": (False, {}),
    "Intel kernels": (True, {}),
    "Intel kernels, MKL_ENABLE_INSTRUCTIONS=AVX2": (True, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
    "MKL_ENABLE_INSTRUCTIONS=AVX2 alone": (False, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
}


def digests() -> dict:
    """In this process: MKL's level and the two means' digests."""
    import torch

    from fedssl.strategies.aggregation import fedavg
    from tests.mkl_dispatch import mkl_isa

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    stack = torch.randn(300, 50_000, generator=g)
    w = torch.rand(300, generator=g, dtype=torch.float64)
    w /= w.sum()

    def digest(t):
        return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]

    blas = digest(w.float() @ stack)
    running = digest(fedavg({"v": stack}, w)["v"])
    return {"mkl_isa": mkl_isa(), "blas": blas, "fedavg": running}


def main() -> None:
    from fedssl.stage.runtime import cpu_summary
    from tests.mkl_dispatch import intel_dispatch_library, preloaded

    print(f"# {cpu_summary()}")
    print("| MKL kernels | MKL level | w @ stack | fedavg |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        library = intel_dispatch_library(Path(tmp))
        for name, (intel, extra) in SETTINGS.items():
            env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", *extra)}
            env |= extra | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
            env = preloaded(env, library) if intel and library else env
            out = subprocess.run(
                [sys.executable, __file__, "--child"], env=env, cwd=REPO,
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            d = json.loads(out.splitlines()[-1])
            print(f"| {name} | {d['mkl_isa']} | {d['blas']} | {d['fedavg']} |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(digests()))
    else:
        main()
