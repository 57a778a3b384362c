"""Planning: which stages exist, what each runs, reads and writes, and when each must run.

* :mod:`~fedssl.plan.layout`: where data, partitions, experiments, results and reports live;
* :mod:`~fedssl.plan.dag`: the :class:`~fedssl.plan.dag.Dag` of stages (the one source both
  front ends read), their content keys, records and fingerprints;
* :mod:`~fedssl.plan.record`: each stage's plan record (``pipelines/plan/<stage>.json``), what
  the stage runtime reads, and the fingerprint made of it;
* :mod:`~fedssl.plan.freshness`: why a stage must run, and the receipts Snakemake plans with;
* :mod:`~fedssl.plan.dvcfile`: the generated ``dvc.yaml`` files, and recording in ``dvc.lock``
  what Snakemake ran;
* :mod:`~fedssl.plan.cli`: the command line (``python -m fedssl.pipeline ...``).

A stage imports only the layout, the record and the hashes (through :mod:`fedssl.stage`), never
the DAG, so editing the planner, the freshness rules, the ``dvc.yaml`` writer or the command
line reruns no stage whose record stays the same. Nothing here
imports torch: planning stays cheap.
"""
