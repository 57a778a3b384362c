"""One precision policy for every forward pass that trains or evaluates: which autocast dtype a
device runs under and whether convolution models and image batches go channels-last.

The setting (:data:`fedssl.params.PrecisionSetting`) is each experiment's ``precision``; a stage
runs its body inside :func:`policy` with it, and the library's forward passes ask
:func:`under_policy` / :func:`channels_last` without naming it. Outside any stage the setting is
``auto``. :func:`under_policy` is the one place autocast is applied, and the runtime calls it:
local training through :func:`fedssl.fl.cohort.forward`, centralised loops (the probes,
fine-tuning, a method's own epochs and encodings) through :mod:`fedssl.training.epochs`,
MocoSFL's split trainer for its server step; no other method names it, nor autocast
(``tests/fl/test_precision.py`` scans for both).

* ``auto``: bf16 autocast where the device computes bf16 natively (CUDA; a CPU with AVX-512
  BF16 or AMX, detected once), fp32 elsewhere; channels-last either way;
* ``fp32``: plain fp32, contiguous layout: the code path of every result made before the
  setting existed;
* ``fp32_channels_last``: plain fp32, channels-last: fp32 where it is fastest;
* ``bf16``: bf16 autocast and channels-last wherever it runs (emulated where not native).

Channels-last is the faster layout for the library's convolutional steps in fp32 too
(``benchmarks/fp32_layout.py``: 1.3-1.7x with BatchNorm or no norm, 1.0-1.1x with GroupNorm,
with or without AVX-512; the eager channels-last step beats the compiled contiguous one); ``fp32``
keeps the contiguous layout so that its results stay bit for bit. What a step computes in
(:func:`mode`: ``fp32``, ``fp32_channels_last`` or ``bf16``) keys the compiled-step table.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from functools import cache
from typing import TypeVar, get_args

import torch

from fedssl.layout import is_channels_last
from fedssl.params import PrecisionSetting
from fedssl.stage.runtime import bf16_capped

SETTINGS = get_args(PrecisionSetting)
FP32 = ("fp32", "fp32_channels_last")  # the settings that never autocast
T = TypeVar("T")
_active: PrecisionSetting = "auto"  # the running stage's setting (see policy())


def _check(setting: str) -> PrecisionSetting:
    if setting not in SETTINGS:
        raise ValueError(f"precision {setting!r}: expected one of {', '.join(SETTINGS)}")
    return setting


@contextmanager
def policy(setting: PrecisionSetting):
    """Run the block under ``setting``: every :func:`under_policy` and :func:`channels_last` that
    names no setting of its own follows it."""
    global _active
    before, _active = _active, _check(setting)
    try:
        yield
    finally:
        _active = before


def use(setting: PrecisionSetting) -> None:
    """Make ``setting`` this process's policy for good: for a process that only ever works for
    one experiment (a Flower SuperNode), where no block encloses the work."""
    global _active
    _active = _check(setting)


def active() -> PrecisionSetting:
    return _active


@cache
def native_bf16(device_type: str) -> bool:
    """Whether a device type multiplies bf16 in hardware: CUDA, and CPUs whose capability torch
    reports as AVX-512 BF16 or AMX tiles (other CPUs emulate it, slower than fp32), unless the
    environment caps torch's kernels below those instructions (:func:`fedssl.stage.runtime.isa_cap`:
    how an AVX-512 machine stands in for an AVX2 one)."""
    if device_type == "cuda":
        return True
    if device_type != "cpu" or bf16_capped():
        return False
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def _device(where: torch.device | torch.Tensor | str) -> torch.device:
    if isinstance(where, torch.Tensor):
        return where.device
    return torch.device(where)


def autocast_dtype(
    where: torch.device | torch.Tensor | str, precision: PrecisionSetting | None = None
) -> torch.dtype | None:
    """The dtype autocast runs in on ``where`` (a device or a tensor on it), None for fp32.
    ``precision``: the setting to resolve, by default the active one."""
    setting = _check(precision or _active)
    if setting in FP32:
        return None
    if setting == "bf16" or native_bf16(_device(where).type):
        return torch.bfloat16
    return None


def under_policy(
    where: torch.device | torch.Tensor | str, fn: Callable[..., T], *args, **kwargs
) -> T:
    """``fn(*args, **kwargs)`` computed under the active policy on ``where`` (a device, or a
    tensor on it): inside bf16 autocast where the policy says bf16, in plain fp32 otherwise (a
    disabled autocast: the fp32 code path bit for bit). Results come back as computed (bf16
    where autocast made them so). One call is one autocast region: forwards that share weights
    in one region share their bf16 weight casts, and their gradients sum in bf16 there, so a
    call keeps together what must stay bit for bit as it ran."""
    device = _device(where)
    dtype = autocast_dtype(device)
    with torch.autocast(device.type, dtype or torch.bfloat16, enabled=dtype is not None):
        return fn(*args, **kwargs)


def channels_last(precision: PrecisionSetting | None = None) -> bool:
    """Whether convolution models and image batches use the channels-last memory format: under
    every setting (by default the active one) but ``fp32`` (the old code path), in bf16 and in
    fp32 alike, on every device (oneDNN on the CPU, cuDNN on CUDA)."""
    return _check(precision or _active) != "fp32"


def laid_out(tensor: torch.Tensor) -> torch.Tensor:
    """A 4-D tensor (a convolution's weight) in the policy's memory format: channels-last but
    under ``fp32``, as it is there (``fp32`` never changes a layout)."""
    if tensor.dim() != 4 or not channels_last() or is_channels_last(tensor):
        return tensor
    # explicit channels-last strides: for one input channel ``.contiguous(channels_last)``
    # keeps the NCHW strides (the layouts coincide), the convolution then picks NCHW for the
    # first layer, and its ReLU's backward mixes layouts (4.6x slower in the profiled round)
    return torch.empty_like(tensor, memory_format=torch.channels_last).copy_(tensor)


def resolved(
    where: torch.device | torch.Tensor | str, precision: PrecisionSetting | None = None
) -> str:
    """What a setting (by default the active one) computes in on ``where``: ``bf16``
    (autocast) or ``fp32``; stages record it beside their outputs and the setting, which
    gives the layout (channels-last but under ``fp32``)."""
    return "bf16" if autocast_dtype(where, precision) is not None else "fp32"


def mode(
    where: torch.device | torch.Tensor | str, precision: PrecisionSetting | None = None
) -> str:
    """What a setting (by default the active one) computes in on ``where``, with the layout
    where fp32 has two: ``bf16``, ``fp32_channels_last`` or ``fp32`` (contiguous); the key of
    the compiled-step table (:mod:`fedssl.compiled`), whose rows are timed per mode."""
    computed = resolved(where, precision)
    if computed == "fp32" and channels_last(precision):
        return "fp32_channels_last"
    return computed
