"""Stage scripts: one thin script per kind of stage (python -m stages.<kind> ...)."""
