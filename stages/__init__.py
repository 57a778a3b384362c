"""Stage scripts: one thin script per kind of stage (python -m stages.<kind> ...); a method's
steps run through stages.method, the shared evaluations through stages.evaluation."""
