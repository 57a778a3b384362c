# The workflow: every rule comes from the DAG in fedssl/plan/dag.py (the same source that
# generates dvc.yaml). Pick a pipeline of params/pipelines.yaml with `--config pipeline=NAME`.
#
# Snakemake sees each stage through a receipt file (artifacts/.receipts/<stage>.done), not
# through the stage's outputs: Snakemake deletes a job's outputs before running it, and a stage
# replaces its own outputs atomically only when it succeeds, so a failed or interrupted run
# loses nothing. Receipts say what is up to date (fedssl.plan.freshness.sync_receipts). The
# report's files, for `snakemake --report`, are declared as copies beside its receipt, for the
# same reason: a failed or killed report job loses only those copies, never the committed report.
import os
import sys

sys.path.insert(0, workflow.basedir)
from fedssl.plan.dag import Dag
from fedssl.plan.dvcfile import commit_ran
from fedssl.plan.freshness import (
    RAN_LOG, check_data, receipt, show_command, shown, shown_files, sync_receipts, tidy
)
from fedssl.plan.layout import LOGS
from fedssl.stage.record import write_records
from fedssl.stage.runtime import RUN_ENV, StageFailed, hold_run, release_run

PIPELINE = config.get("pipeline", "default")
GPUS = int(config.get("gpus", 1))  # 0: run the training stages without asking for a GPU
# A compute stage's threads: one (the stages run side by side, one a core: under load a second
# thread waits on a descheduled sibling, README "Speed"), or --config threads=N, or a cluster
# profile's --max-threads (a job with cores of its own). Past one, OpenMP's idle threads sleep.
MAX_THREADS = getattr(getattr(workflow, "resource_settings", None), "max_threads", None)
THREADS = int(config.get("threads") or MAX_THREADS or 1)
# override runs (`fedssl run EXP key=value`): experiments EXP@<hash> beside the pipeline's
DERIVED = [name for name in str(config.get("derived", "")).split(",") if name]
STAGES_DAG = Dag(PIPELINE, derived=DERIVED)  # validates every params file first: errors stop here
check_data(STAGES_DAG)                # and says how to get a missing data set
# each stage's plan record, which its job reads (pipelines/plan/; part of its fingerprint): the
# ones that exist follow the plan at once (after an edit is undone, both front ends see the stage
# as it was), new ones are written only when jobs run (onstart): a dry run creates no file
write_records([STAGES_DAG.record(name) for name in STAGES_DAG.stages], existing_only=True)
STALE = sync_receipts(STAGES_DAG)     # what changed since each stage last ran (files included)
for name, reasons in STALE.items():
    print(f"{name} will run: {'; '.join(reasons[:4])}" + (" ..." if len(reasons) > 4 else ""),
          file=sys.stderr)
LEFT = tidy(STAGES_DAG, STALE)        # what killed stages left: partial folders, checkpoints
if LEFT:
    print(f"removed what killed stages left: {', '.join(map(str, LEFT[:4]))}"
          + (f" and {len(LEFT) - 4} more" if len(LEFT) > 4 else ""), file=sys.stderr)


rule all:
    input:
        str(receipt(f"report__{PIPELINE}")),


for stage in STAGES_DAG.stages.values():

    rule:
        name:
            stage.name
        input:
            [str(receipt(u)) for u in stage.upstream],
        output:
            str(receipt(stage.name)),
            # the report's files, for `snakemake --report`: their copies, made on success
            [report(str(shown(stage.name, p)), category=PIPELINE) for p in shown_files(stage)],
        log:
            str(LOGS / f"{stage.name}.log"),
        threads: THREADS if stage.gpu else 1  # capped by --cores
        resources:
            gpu=int(stage.gpu and GPUS > 0),
        params:
            cmd=stage.cmd,  # params are bound now; a shell string would see the last stage
            name=stage.name,
            ran=RAN_LOG,
            show=show_command(stage.name, shown_files(stage)),
        shell:
            # tee -i: on Ctrl-C the stage's last words still reach the terminal and the log
            "FEDSSL_THREADS={threads} OMP_WAIT_POLICY=${{OMP_WAIT_POLICY:-PASSIVE}} "
            "{params.cmd} 2>&1 | tee -i {log} && {params.show} && "
            "echo {params.name} >> {params.ran} && echo ran > {output[0]}"


onstart:
    # the run lock: no DVC run replaces what these jobs read, nor they what its stages read
    try:
        os.environ[RUN_ENV] = hold_run("snakemake")
    except StageFailed as refused:
        sys.exit(f"error: {refused}")
    write_records([STAGES_DAG.record(name) for name in STAGES_DAG.stages])


onsuccess:
    commit_ran(PIPELINE)
    release_run(os.environ.get(RUN_ENV, ""))


onerror:
    commit_ran(PIPELINE, succeeded=False)
    release_run(os.environ.get(RUN_ENV, ""))
