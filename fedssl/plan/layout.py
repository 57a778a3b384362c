"""Where everything lives: the output folders of the stages (``artifacts/``, cached by DVC) and
the small result files committed with the code (``results/``). Pure path functions, importing
nothing of the project: a stage, the report and a method's report code may all use them."""

from __future__ import annotations

from pathlib import Path

ARTIFACTS = Path("artifacts")
RESULTS = Path("results")  # small result files committed with the code (DVC, cache: false)
LOGS = ARTIFACTS / "logs"  # one log file per stage run by Snakemake


def data_dir(dataset: str) -> str:
    return f"{ARTIFACTS}/data/{dataset}"


def partition_dir(partition: str) -> str:
    return f"{ARTIFACTS}/partitions/{partition}"


def experiment_dir(experiment: str) -> str:
    return f"{ARTIFACTS}/experiments/{experiment}"


def results_dir(experiment: str) -> str:
    return f"{RESULTS}/experiments/{experiment}"


def report_dir(pipeline: str) -> str:
    return f"{RESULTS}/reports/{pipeline}"


def report_artifacts_dir(pipeline: str) -> str:
    return f"{ARTIFACTS}/reports/{pipeline}"


def owner_of(stage_out: str) -> str:
    """The experiment a per-experiment stage is named after (the one that owns its content),
    from its output folder ``artifacts/experiments/<owner>/<kind>``."""
    return Path(stage_out).parent.name


class ReportRow(dict):
    """One experiment's row of a report (what the report files hold), which also says where
    each of its method's steps wrote its committed results (``step_results``: step kind ->
    folder; a step shared by several experiments writes under the experiment that owns it).
    The extra attribute is for a method's report tables and figures; it is not written out."""

    def __init__(self, values: dict, step_results: dict[str, Path]):
        super().__init__(values)
        self.step_results = step_results
