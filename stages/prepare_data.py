"""Stage: read a data set from its usual on-disk layout once and store it as a uint8 artifact.

It runs by its plan record alone: the record names the data set's reader (its one hook) and
says where to read from (its params, validated by the planner, with the registry's default
place filled in), so no params models, presets or registry code run here."""

from __future__ import annotations

from fedssl.data import write_prepared
from fedssl.data.sets import DataNotFound
from fedssl.stage.base import Stage, StageFailed, main_guard


def run(argv):
    ctx = Stage.from_argv("prepare_data", argv, "a params/datasets/<name>.yaml preset")
    dataset = ctx.record["dataset"]
    try:
        splits = ctx.hook().load(dataset["root"], dataset["download"])
    except DataNotFound as e:
        raise StageFailed(str(e)) from None
    with ctx.run() as out:
        ctx.info["data"] = write_prepared(out, dataset["name"], splits)


if __name__ == "__main__":
    main_guard(run)
