"""Stage: read a data set from its usual on-disk layout once and store it as a uint8 artifact."""

from __future__ import annotations

from fedssl.data.sources import DataNotFound, load_dataset
from fedssl.data.store import write_prepared
from fedssl.stage import StageFailed, main_guard
from stages.common import context


def run(argv):
    ctx = context("prepare_data", argv, "a params/datasets/<name>.yaml preset")
    params = ctx.presets.load("dataset", ctx.name)
    try:
        splits = load_dataset(params.name, params.data_root, params.download)
    except DataNotFound as e:
        raise StageFailed(str(e)) from None
    with ctx.run() as out:
        ctx.info["data"] = write_prepared(out, params.name, splits)


if __name__ == "__main__":
    main_guard(run)
