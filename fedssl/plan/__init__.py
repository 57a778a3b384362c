"""Planning: which stages exist, what each runs, reads and writes, and when each must run.

* :mod:`~fedssl.plan.layout`: where data, partitions, experiments, results and reports live;
* :mod:`~fedssl.plan.dag`: the :class:`~fedssl.plan.dag.Dag` of stages (the one source both
  front ends read), their content keys, records and fingerprints;
* :mod:`~fedssl.plan.freshness`: why a stage must run, and the receipts Snakemake plans with;
* :mod:`~fedssl.plan.dvcfile`: the generated ``dvc.yaml`` files, and recording in ``dvc.lock``
  what Snakemake ran;
* :mod:`~fedssl.plan.cli`: the command line (``python -m fedssl.pipeline ...``).

What the planner writes for each stage, its plan record, and the fingerprint made of it are in
:mod:`fedssl.stage.record` (a ground-floor module): a stage reads its record (through
:mod:`fedssl.stage.base`) and, if it loads presets, the layout here, never the DAG, so editing
the planner, the freshness rules, the ``dvc.yaml`` writer or the command line reruns no stage
whose record stays the same. Nothing here imports torch: planning stays cheap.
"""
