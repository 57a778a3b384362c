# The workflow: every rule comes from the DAG in fedssl/pipeline.py (the same source that
# generates dvc.yaml). Pick a pipeline of params/pipelines.yaml with `--config pipeline=NAME`.
import sys

sys.path.insert(0, workflow.basedir)
from fedssl.pipeline import RAN_LOG, Dag, commit_ran, sync_stamps

PIPELINE = config.get("pipeline", "default")
STAGES_DAG = Dag(PIPELINE)            # validates every params file first: errors stop here
STAMPS, STALE = sync_stamps(STAGES_DAG)  # content fingerprints -> stamp files (see pipeline.py)


rule all:
    input:
        STAGES_DAG.stages[f"report__{PIPELINE}"].out,


for stage in STAGES_DAG.stages.values():

    rule:
        name:
            stage.name
        input:
            [d if stage.name in STALE else ancient(d) for d in stage.deps]
            + [STAMPS[stage.name]],
        output:
            [directory(stage.out)] + stage.committed,
        threads: 1024 if stage.gpu else 1  # capped at --cores: training stages take them all
        resources:
            gpu=int(stage.gpu),
        params:
            cmd=stage.cmd,  # params are bound now; a shell string would see the last stage
            name=stage.name,
            ran=RAN_LOG,
        shell:
            "FEDSSL_THREADS={threads} {params.cmd} && echo {params.name} >> {params.ran}"


onsuccess:
    commit_ran()


onerror:
    commit_ran()
