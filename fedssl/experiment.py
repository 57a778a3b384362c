"""The experiment model: the shared sections of :mod:`fedssl.params` plus the ``method`` union of
the registered methods. It sits above the method registry (the methods' params build on
:mod:`fedssl.params`, which imports no method), and writes the JSON Schemas of every params file
(``python -m fedssl.experiment`` -> ``schemas/``; a test fails when they are stale).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Union

from pydantic import Field, create_model, model_validator

from fedssl.methods import registry
from fedssl.params import (
    PRECISION_HELP,
    SCHEMA_DIR,
    DatasetParams,
    FeatureParams,
    FinetuneParams,
    GridsParams,
    KnnParams,
    LinearProbeParams,
    Name,
    PartitionParams,
    PersonalEvalParams,
    PipelinesParams,
    PrecisionSetting,
    Strict,
    preset_schema,
)


class ExperimentBase(Strict):
    """What every experiment has; :func:`experiment_model` adds the ``method`` union."""

    title: str = Field(description="row label in the report")
    partition: Name = Field(description="name of a params/partitions preset")
    features: FeatureParams | None = Field(None, description="for methods evaluated by probes")
    linear_probe: LinearProbeParams | None = None
    knn: KnnParams | None = None
    personal: PersonalEvalParams | None = Field(None, description="for personalised methods")
    precision: PrecisionSetting = Field("auto", description=PRECISION_HELP)
    finetune: FinetuneParams | None = Field(
        None,
        description="also fine-tune the encoder end to end (methods whose encoder "
        "can be trained: `finetunable`)",
    )

    @model_validator(mode="after")
    def _evaluation_sections(self):
        """The sections the method's evaluation reads must be there (and only those)."""
        wanted = registry.get(self.method.name).evaluation_sections
        for section in ("features", "linear_probe", "knn", "personal"):
            if section in wanted and getattr(self, section) is None:
                raise ValueError(
                    f"method '{self.method.name}' is evaluated with `{section}`: add that section"
                )
            if section not in wanted and getattr(self, section) is not None:
                raise ValueError(
                    f"method '{self.method.name}' does not read `{section}`: remove it"
                )
        if self.finetune is not None and not registry.get(self.method.name).finetunable:
            raise ValueError(
                f"method '{self.method.name}' has no encoder to fine-tune: remove `finetune`"
            )
        return self


_EXPERIMENT_MODEL: dict[tuple, type] = {}


def experiment_model() -> type[ExperimentBase]:
    """The experiment model for the methods registered now (rebuilt when one is added)."""
    members = tuple(m.params for m in registry.all())
    if members not in _EXPERIMENT_MODEL:
        union = (
            members[0]
            if len(members) == 1
            else Annotated[Union[members], Field(discriminator="name")]  # noqa: UP007
        )
        _EXPERIMENT_MODEL[members] = create_model(
            "ExperimentParams",
            __base__=ExperimentBase,
            method=(union, Field(description="the method and everything it reads")),
        )
    return _EXPERIMENT_MODEL[members]


def json_schemas() -> dict[str, str]:
    """File name -> JSON Schema text, generated from the models (for editors and tests)."""
    schemas = {
        "dataset": preset_schema(DatasetParams),
        "partition": preset_schema(PartitionParams),
        "experiment": preset_schema(experiment_model()),
        "grids": GridsParams.model_json_schema(),
        "pipelines": PipelinesParams.model_json_schema(),
    }
    return {
        f"{kind}.schema.json": json.dumps(s, indent=2, ensure_ascii=False) + "\n"
        for kind, s in schemas.items()
    }


def write_schemas() -> None:
    Path(SCHEMA_DIR).mkdir(exist_ok=True)
    for name, text in json_schemas().items():
        (Path(SCHEMA_DIR) / name).write_text(text)
        print(f"wrote {SCHEMA_DIR}/{name}")


def main(argv: list[str] | None = None) -> int:
    """``python -m fedssl.experiment`` (``fedssl schemas``): write schemas/."""
    write_schemas()
    return 0


if __name__ == "__main__":
    main()
