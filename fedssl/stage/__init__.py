"""The stage runtime: what every stage runs on, whatever it computes. The contract a stage keeps
(:mod:`~fedssl.stage.base`: its lock, input digests, atomic outputs, resume), the context of a
stage that reads validated presets (:mod:`~fedssl.stage.context`), the plan record it runs by
(:mod:`~fedssl.stage.record`), the plumbing of devices, seeds, atomic writes and run metadata
(:mod:`~fedssl.stage.runtime`), progress lines (:mod:`~fedssl.stage.progress`) and the
step-input names and typed context a method's hooks see (:mod:`~fedssl.stage.contract`). The
modules sit at different layers (pyproject's import contract: the context above the methods, the
plumbing at the ground floor), so this file imports none of them."""
