"""The benchmark board: every method of a pipeline side by side, accuracy beside its cost.

It branches on no method. It reads what the pipeline's report stage committed (its rows:
the probes' and the personalised evaluation's accuracies, the per-client traffic and the
``costs`` stage's columns) and the run records of the stages (``artifacts/.runs/``: wall
time, the machine), groups the runs that differ only in their seed, and writes into the
report's folder:

- ``board.md`` (and ``board_tables.md``, its tables alone, for the docs): one table per
  evaluation (self-supervised methods by their probes,
  personalised methods by each client's model on its own test split), a line per method,
  encoder and partition, mean ± SD over seeds, the costs beside; a ⚑ on what the board cannot
  vouch for (:data:`.flags.FLAGS_FILE`: a paper's ordering it inverts, a known diagnosis, a line
  below its zero-cost reference), its note under the table linking the diagnosis;
- ``board.json``: the same numbers, a DVC metric (``dvc metrics diff`` between two boards);
- ``stage_runs.json``: the run records it read (wall seconds, machine), which the next
  rendering falls back on, so a board made part by part keeps every part's wall time;
- ``board_accuracy_vs_MB.png`` and ``board_accuracy_vs_GFLOPs.png``, and the accuracy over
  the run per family (``board_over_run_encoders.png``, ``board_over_run_personalised.png``;
  every run's per-round curves are the report's ``curves.png``).

Its modules: the cells (:mod:`.cells`: a line per method, encoder and partition over seeds),
which lines separate (:mod:`.significance`; the planned questions, :mod:`.questions`, with
their test images where the runs kept per-image records, :mod:`.imagewise`), what it cannot
vouch for (:mod:`.flags`), the tables (:mod:`.tables`), the figures (:mod:`.figures`), the
budget rule that sets each method's rounds (:mod:`.budget`, ``python -m
fedssl.reporting.board budget``) and the writing of it all (:mod:`.write`).

``python -m fedssl.reporting.board render PIPELINE`` (``make benchmark`` runs it after the
pipeline); ``fedssl docs`` refills the docs' ``<!-- board: PIPELINE -->`` blocks from it.
"""

# The parts as attributes (``board.tables.table``): the package is one layer, a face.
from fedssl.reporting.board import budget, cells, figures, flags, significance, tables, write

__all__ = ["budget", "cells", "figures", "flags", "significance", "tables", "write"]
