"""Compiled local steps: whether the cohort trainer's step (forward under the precision policy,
loss, backward) runs through ``torch.compile`` (inductor) or eagerly.

The setting is each experiment's ``compile`` (:data:`fedssl.params.CompileSetting`); a stage
that computes on a device runs its body inside :func:`policy` with it, as it does with the
precision policy:

* ``off`` (the default): eager, the code path of every committed result;
* ``on``: compiled, for every model family;
* ``auto``: compiled where the committed benchmark table of this CPU kind
  (``results/bench/compiled_step/<cpu kind>.tsv``, written by
  ``benchmarks/compiled_step.py``) says so for the model's family and the precision mode it
  computes in (fp32 contiguous or channels-last, bf16);
  no table or no row: eager. A table, not a timing at run time, so that a run's numbers stay a
  function of its params and its CPU.

A compiled step agrees with the eager one within float rounding, not bit for bit (inductor
fuses and reorders the arithmetic). The compile is paid once per trainer, that is once per
stage and phase, on its first step (and once more when the batch shape first changes). Each
trainer's choice is recorded in the stage's meta.json (``compiled_steps``).
"""

from __future__ import annotations

import csv
import os
import re
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TypeVar, get_args

from torch import nn

from fedssl.params import CompileSetting
from fedssl.stage.runtime import cpu

SETTINGS = get_args(CompileSetting)
_CONSTANT_AT_TRACE: list[Callable] = []  # marked for the compiler when a step first compiles
TABLE_DIR = Path(__file__).resolve().parent.parent / "results" / "bench" / "compiled_step"
F = TypeVar("F", bound=Callable)
_active: CompileSetting = "off"
_choices: dict[str, str] | None = None  # the running stage's record: family -> on / off


@contextmanager
def policy(setting: CompileSetting, choices: dict[str, str] | None = None):
    """Run the block under ``setting``; every trainer built in it records its choice in
    ``choices`` (the stage's meta.json section, filled as the body runs)."""
    global _active, _choices
    if setting not in SETTINGS:
        raise ValueError(f"compile {setting!r}: expected one of {', '.join(SETTINGS)}")
    before = _active, _choices
    _active, _choices = setting, choices
    try:
        yield
    finally:
        _active, _choices = before


def family(model: nn.Module) -> str:
    """The model family a table row names: the model's class and the kind of its backbone
    (``ContrastiveModel/cnn``, ``ContrastiveModel/resnet18``, ``Anchored/cnn``,
    ``MocoV3Learner/vit``). The kind is read off the modules it holds, so any model has one."""
    kinds = [type(m).__name__ for m in model.modules()]
    if any("Attention" in k for k in kinds):
        backbone = "vit"
    elif "BasicBlock" in kinds:  # two convolutions a block, with the stem and the output
        backbone = f"resnet{2 + 2 * kinds.count('BasicBlock')}"
    elif "Conv2d" in kinds:
        backbone = "cnn"
    else:
        backbone = "mlp"
    return f"{type(model).__name__}/{backbone}"


def cpu_kind() -> str:
    """This CPU as the run record names it (model, family and model numbers, any kernel cap),
    as a file name: ``amd-epyc-family-25-model-17``."""
    c = cpu()
    name = c["cpu_model"] + (f" cap {c['cpu_isa_cap']}" if c["cpu_isa_cap"] else "")
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@cache
def table(kind: str) -> dict[tuple[str, str], str]:
    """(family, precision) -> ``on`` / ``off`` from the committed table of CPU ``kind``
    (empty when there is none)."""
    path = TABLE_DIR / f"{kind}.tsv"
    if not path.is_file():
        return {}
    with path.open() as f:
        rows = csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t")
        return {(r["family"], r["precision"]): r["choice"] for r in rows}


def chosen(model: nn.Module, precision: str, setting: CompileSetting | None = None) -> bool:
    """Whether ``model``'s step compiles under ``setting`` (by default the active one) in the
    ``precision`` mode it computes in (:func:`fedssl.precision.mode`: ``fp32``,
    ``fp32_channels_last``, ``bf16``); a mode the table has no row for runs eagerly."""
    setting = setting or _active
    if setting != "auto":
        return setting == "on"
    return table(cpu_kind()).get((family(model), precision)) == "on"


def constant_at_trace(fn: F) -> F:
    """``fn`` marked for ``torch.compile`` as a function whose result is a constant (traced
    once, its result baked in). Marked when a step first compiles (:func:`step`), not here:
    ``torch.compiler.assume_constant_result`` imports the compiler, about 1.3 s of every stage
    process's start, though a committed run never compiles."""
    _CONSTANT_AT_TRACE.append(fn)
    return fn


def step(model: nn.Module, fn: F) -> F:
    """``fn`` (the trainer's loss of ``model``), compiled where :func:`chosen` says so for the
    precision the active policy resolves to on the model's device; the choice is recorded in
    the running stage's meta.json. Build it once per trainer: the compiled function keeps its
    compiled code for the trainer's life."""
    import torch

    from fedssl.precision import mode

    device = next(model.parameters(), torch.empty(0)).device
    on = chosen(model, mode(device))
    if _choices is not None:
        _choices[family(model)] = "on" if on else "off"
    if not on:
        return fn
    separate_capped_cache()
    for constant in _CONSTANT_AT_TRACE:
        torch.compiler.assume_constant_result(constant)  # marks it in place
    return torch.compile(fn)


def separate_capped_cache() -> None:
    """Inductor picks its vector instructions by ``ATEN_CPU_CAPABILITY`` but does not key its
    on-disk cache on them, so a capped process (an AVX-512 machine standing in for an AVX2 one)
    would load kernels an uncapped process compiled and compute wrong numbers without an error,
    or crash. A capped process compiles into a cache of its own, unless
    ``TORCHINDUCTOR_CACHE_DIR`` names one other than torch's default (which torch writes into
    the variable once it has looked)."""
    cap = re.sub(r"\W", "_", os.environ.get("ATEN_CPU_CAPABILITY", "").lower())
    if not cap:
        return
    try:  # torch's own default, where this torch has the helper (2.5 on)
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        default = os.path.abspath(default_cache_dir())
    except ImportError:
        default = None
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default):
        folder = Path(tempfile.gettempdir()) / f"torchinductor_{os.getuid()}_{cap}"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
