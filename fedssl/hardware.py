"""What machine a number came from: the CPU's model and the vector extensions its float kernels
can use (the part of a CPU that changes which kernels run, hence the last digits of a result).
Read from /proc/cpuinfo, without importing torch, so light stages and benchmarks can say it."""

from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

# The flags that pick a different float kernel (x86: SSE -> AVX2 -> AVX-512 -> bf16/AMX; Arm:
# NEON -> SVE, bf16), strongest last, in /proc/cpuinfo's spelling.
VECTOR_FLAGS = (
    "sse4_2",
    "avx",
    "fma",
    "avx2",
    "avx_vnni",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "asimd",
    "sve",
    "sve2",
    "bf16",
)
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


@cache
def cpu() -> dict:
    """{"cpu_model", "cpu_vector_extensions", "cpu_native_bf16"}: the CPU's name (with its
    family and model numbers where given: a virtual machine's name may say only "AMD EPYC")
    and which of :data:`VECTOR_FLAGS` it has."""
    info = _cpuinfo()
    model = info.get("model name") or info.get("Model") or platform.processor() or "unknown"
    if info.get("cpu family") and info.get("model"):
        model += f" (family {info['cpu family']}, model {info['model']})"
    flags = set((info.get("flags") or info.get("Features") or "").split())
    vector = [f for f in VECTOR_FLAGS if f in flags]
    return {
        "cpu_model": model,
        "cpu_vector_extensions": vector,
        "cpu_native_bf16": any(f in flags for f in NATIVE_BF16_FLAGS),
    }


def cpu_summary() -> str:
    """One line: 'AMD EPYC, 2 cores, avx2 avx512f avx512_bf16 (native bf16)'."""
    import os

    c = cpu()
    bf16 = "native bf16" if c["cpu_native_bf16"] else "no native bf16"
    return (
        f"{c['cpu_model']}, {os.cpu_count()} cores, "
        f"{' '.join(c['cpu_vector_extensions']) or 'no listed vector extensions'} ({bf16})"
    )


def computed_on(device=None) -> dict:
    """What a compute stage's numbers depend on besides its inputs and precision: the CPU (model,
    vector extensions), the threads and OpenMP's wait policy, and the GPU where it ran on one.
    Call after the thread count is set (:func:`fedssl.stagebase.set_threads`)."""
    import os
    import sys

    c = cpu()
    out = {"cpu": c["cpu_model"], "vector_extensions": c["cpu_vector_extensions"]}
    if "torch" in sys.modules:
        out["threads"] = sys.modules["torch"].get_num_threads()
    out["wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "default").lower()
    if device is not None and getattr(device, "type", None) == "cuda":
        import torch

        out["gpu"] = torch.cuda.get_device_name(device)
    return out
