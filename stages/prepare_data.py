"""Stage: read a data set from its usual on-disk layout once and store it as a uint8 artifact."""
from __future__ import annotations

from fedssl.data.sources import DataNotFound, load_dataset
from fedssl.data.store import write_prepared
from fedssl.params import load_preset
from fedssl.stage import StageFailed, main_guard, stage_run
from stages.common import parse_stage


def run(argv):
    dag, stage, name = parse_stage("prepare_data", argv, "a params/datasets/<name>.yaml preset")
    params = load_preset("dataset", name)
    try:
        splits = load_dataset(params.name, params.data_root, params.download)
    except DataNotFound as e:
        raise StageFailed(str(e)) from None
    with stage_run(dag, stage) as (_, out, _device, info):
        info["data"] = write_prepared(out, params.name, splits)


if __name__ == "__main__":
    main_guard(run)
