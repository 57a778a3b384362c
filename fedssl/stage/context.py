"""The stage context of every stage that reads validated presets: a method's steps and hooks,
the evaluations, the partition and the report. It is a :class:`fedssl.stage.base.Stage` (run by
its plan record: lock, inputs checked, atomic outputs, meta.json) that also gives the body its
validated params (validated first: a bad value stops it before any compute, naming the field
and the file), the experiment's method, where the prepared data and partition are, and, for a
stage that computes on a device, the device and the experiment's precision. It implements
:class:`fedssl.stage.contract.StepContext`, the type the method plugins name.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager, nullcontext
from functools import cached_property
from pathlib import Path

from fedssl.plan.layout import data_dir, experiment_dir, partition_dir, results_dir
from fedssl.presets import Presets, derived_from, overrides_of
from fedssl.stage.base import (
    RESUME_DIR,
    RUNS_DIR,
    Stage,
    main_guard,
    run_record,
    set_threads,
)
from fedssl.stage.record import COMPILED, PRECISION
from fedssl.stage.runtime import StageFailed, computed_on, pick_device


@contextmanager
def _both(first, second):
    with first, second:
        yield


__all__ = ["StageContext", "StageFailed", "main_guard", "RESUME_DIR", "RUNS_DIR", "run_record"]


class StageContext(Stage):
    """Stage ``<kind>__<name>`` of the project under ``params/``, with its presets."""

    # ------------------------------------------------------------------ params
    @cached_property
    def presets(self):
        return Presets()

    @cached_property
    def exp(self):
        return self.presets.load("experiment", self.name)

    @cached_property
    def partition(self):
        return self.presets.load("partition", self.exp.partition)

    @cached_property
    def dataset_name(self) -> str:
        """The data set preset the experiment's partition splits."""
        return self.partition.dataset

    @cached_property
    def method(self):
        """The experiment's method plugin (the registry is imported by name: it is code of
        every stage that loads an experiment's params, through the experiment model)."""
        return importlib.import_module("fedssl.methods.registry").get(self.exp.method.name)

    # ------------------------------------------------------------------ where things are
    @property
    def data_dir(self) -> Path:
        return Path(data_dir(self.dataset_name))

    @property
    def partition_dir(self) -> Path:
        return Path(partition_dir(self.exp.partition))

    @property
    def exp_dir(self) -> Path:
        return Path(experiment_dir(self.name))

    @property
    def results_dir(self) -> Path:
        """Where the stage writes its committed result files (round logs, metrics, plots):
        inside :meth:`run`, a scratch folder that lands in ``results/`` on success."""
        return self.committed_dir(Path(results_dir(self.name)))

    # ------------------------------------------------------------------ data
    @cached_property
    def image_shape(self) -> tuple[int, int, int]:
        from fedssl.data import image_shape

        return image_shape(self.data_dir)

    def split(self, split: str = "train"):
        """(uint8 images [N, C, H, W] memory-mapped, int64 labels) of the prepared data."""
        from fedssl.data import load_split

        return load_split(self.data_dir, split)

    def clients(self):
        """Each client's indices into the training split."""
        from fedssl.data import load_clients

        return load_clients(self.partition_dir)

    def client_tests(self):
        """Each client's indices into the test split (partitions with ``client_tests``)."""
        from fedssl.data import load_clients

        if not (self.partition_dir / "test_clients.npz").exists():
            raise StageFailed(
                f"partition '{self.exp.partition}' has no per-client test splits: "
                f"set its `client_tests`"
            )
        return load_clients(self.partition_dir, "test_clients.npz")

    def client_validation(self):
        """Each client's validation indices into the training split (``client_tests.
        validation_per_client``), or None when the partition has none."""
        from fedssl.data import VALIDATION_CLIENTS, load_clients

        if not (self.partition_dir / VALIDATION_CLIENTS).exists():
            return None
        return load_clients(self.partition_dir, VALIDATION_CLIENTS)

    def server_indices(self):
        """The partition's server-side slice of the training split (``server_holdout``)."""
        import numpy as np

        path = self.partition_dir / "server.npy"
        if not path.exists():
            raise StageFailed(
                f"partition '{self.exp.partition}' keeps no data for the server: "
                f"set its `server_holdout`"
            )
        return np.load(path)

    def true_groups(self) -> list[int] | None:
        """Each client's group when the partition has groups (class_groups), else None."""
        import json

        counts = json.loads((self.partition_dir / "class_counts.json").read_text())
        return counts.get("groups")

    # ------------------------------------------------------------------ running
    def compute_settings(self):
        """A stage that computes on the device (its record says so) computes in the
        experiment's precision and records what its numbers depend on: hardware, threads,
        precision; a one-off run's command-line overrides stay beside what it made."""
        policy, computed = nullcontext(), {}
        if self.record["gpu"]:
            # by name: only a stage that computes on the device runs it (its record says so)
            precision = importlib.import_module(PRECISION)

            self.device = pick_device()
            setting = self.exp.precision
            steps: dict[str, str] = {}  # each trainer's compile choice, as the body makes it
            policy = _both(
                precision.policy(setting),
                importlib.import_module(COMPILED).policy(self.exp.compile, steps),
            )
            computed = {"precision": precision.resolved(self.device, setting)}
            if self.exp.compile != "off":
                computed.update(compile=self.exp.compile, compiled_steps=steps)
        set_threads()
        if self.record["gpu"]:
            computed["computed_on"] = computed_on(self.device)
            self.info.update(computed)
            computed["precision_setting"] = setting
        if derived_from(self.name):  # an override run: what it set, over which experiment
            computed["overrides"] = overrides_of(self.name)
            computed["derived_from"] = derived_from(self.name)
            self.info.update(overrides=computed["overrides"], derived_from=computed["derived_from"])
        return policy, computed
