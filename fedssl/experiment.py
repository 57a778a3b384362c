"""The experiment model: the shared sections of :mod:`fedssl.params`, the sections the registered
evaluations add (:func:`fedssl.evaluations.sections`) and the ``method`` union of the registered
methods. It sits above the method registry (the methods' params build on
:mod:`fedssl.params`, which imports no method), and writes the JSON Schemas of every params file
(``python -m fedssl.experiment`` -> ``schemas/``; a test fails when they are stale).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Union

from pydantic import Field, create_model, model_validator

from fedssl import evaluations
from fedssl.methods import registry
from fedssl.params import (
    COMPILE_HELP,
    PRECISION_HELP,
    SCHEMA_DIR,
    CompileSetting,
    DatasetParams,
    GridsParams,
    Name,
    PartitionParams,
    PipelinesParams,
    PrecisionSetting,
    Strict,
    preset_schema,
)


class ExperimentBase(Strict):
    """What every experiment has; :func:`experiment_model` adds the evaluations' sections and
    the ``method`` union."""

    title: str = Field(description="row label in the report")
    partition: Name = Field(description="name of a params/partitions preset")
    precision: PrecisionSetting = Field("auto", description=PRECISION_HELP)
    compile: CompileSetting = Field("off", description=COMPILE_HELP)

    @model_validator(mode="after")
    def _evaluation_sections(self):
        """The sections the method's evaluation reads must be there (and only those); a
        section the experiment chooses, only where the method allows it."""
        method = registry.get(self.method.name)
        for section in evaluations.sections():
            given = getattr(self, section.name) is not None
            wanted = section.name in method.evaluation_sections
            if section.by_method and wanted and not given:
                raise ValueError(
                    f"method '{method.name}' is evaluated with `{section.name}`: add that section"
                )
            if section.by_method and given and not wanted:
                raise ValueError(
                    f"method '{method.name}' does not read `{section.name}`: remove it"
                )
            reason = given and section.refuse and section.refuse(method)
            if reason:
                raise ValueError(f"method '{method.name}' {reason}: remove `{section.name}`")
        self.method.check_sections(self)
        return self


_EXPERIMENT_MODEL: dict[tuple, type] = {}


def experiment_model() -> type[ExperimentBase]:
    """The experiment model for the methods and evaluations registered now (rebuilt when one
    is added)."""
    members = tuple(m.params for m in registry.all())
    sections = tuple(evaluations.sections())
    key = (members, sections)
    if key not in _EXPERIMENT_MODEL:
        union = (
            members[0]
            if len(members) == 1
            else Annotated[Union[members], Field(discriminator="name")]  # noqa: UP007
        )
        fields = {
            s.name: (s.model | None, Field(None, description=s.description or None))
            for s in sections
        }
        _EXPERIMENT_MODEL[key] = create_model(
            "ExperimentParams",
            __base__=ExperimentBase,
            **fields,
            method=(union, Field(description="the method and everything it reads")),
        )
    return _EXPERIMENT_MODEL[key]


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
