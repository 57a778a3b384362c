"""The ground floor where method code and the stage runtime meet: the names of a step's
shared inputs and the :class:`StepContext` a step's runner and a method's hooks are handed.

It imports nothing of the project, so a method's declaration (:mod:`fedssl.methods.base`) and
its hooks can name the context's type without importing the stage runtime, and the runtime
(:mod:`fedssl.stage.context`) implements it without importing any method: no import circle closes
through the two, type-only imports included.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

DATA, PARTITION = "data", "partition"  # step inputs besides the outputs of earlier steps


class StepContext(Protocol):
    """What a stage's body (a method step's runner, a hook) reads and writes through: its
    validated params, where its inputs are, its scratch output folder and device, and the
    facts it records. :class:`fedssl.stage.context.StageContext` is the implementation."""

    name: str  # the experiment (or data set, partition, pipeline) the stage is named after
    kind: str
    out: Path | None  # the scratch output folder, inside run()
    device: Any
    info: dict  # facts of the output, into meta.json
    run_info: dict  # facts of this run, into its run record

    @property
    def exp(self) -> Any: ...  # the experiment's validated params

    @property
    def partition(self) -> Any: ...

    @property
    def method(self) -> Any: ...  # the experiment's method plugin

    @property
    def dataset_name(self) -> str: ...

    @property
    def image_shape(self) -> tuple[int, int, int]: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def partition_dir(self) -> Path: ...

    @property
    def exp_dir(self) -> Path: ...

    @property
    def results_dir(self) -> Path: ...

    @property
    def resume_path(self) -> Path: ...

    @property
    def fingerprint(self) -> str: ...

    def input(self, step: str) -> Path: ...

    def split(self, split: str = "train") -> Any: ...

    def clients(self) -> Any: ...

    def client_tests(self) -> Any: ...

    def client_validation(self) -> Any: ...

    def server_indices(self) -> Any: ...

    def true_groups(self) -> list[int] | None: ...

    def run(self) -> AbstractContextManager[Path]: ...

    def done(self) -> None: ...
