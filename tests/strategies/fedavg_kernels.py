"""The bit-for-bit checks of ``test_fedavg.py`` in a process of their own, so that a test can
run them with the kernels of a capped instruction set (``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS`` are read once, when torch loads; MKL's
Intel kernels are preloaded, :mod:`tests.mkl_dispatch`):

    python -m tests.strategies.fedavg_kernels FOLDER

Prints one line of JSON: the CPU capability torch dispatches to, MKL's instruction-set level,
and a digest of fedavg's result on fixed uploads (the same on every CPU, whatever its kernels)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tests.mkl_dispatch import mkl_isa
from tests.strategies import test_fedavg as checks


def main(folder: Path) -> None:
    torch.set_num_threads(1)
    for clients in (7, 300):
        checks.test_fedavg_and_the_running_mean_are_the_ordered_sum_bit_for_bit(clients)
    # the CPU's cohort (one client at a time); the vectorised one adds no kernel to the sums
    checks.test_a_fedavg_round_is_the_stacked_rounds_model_and_keeps_no_upload(folder, False)
    capability = torch.backends.cpu.get_cpu_capability()
    ran = {"capability": capability, "mkl_isa": mkl_isa(), "digest": checks.fedavg_digest()}
    print(json.dumps(ran))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
