"""``python -m fedssl.pipeline ...``: the pipelines' command line (write, check, commit, accept,
show), kept at this name for the Makefile, the generated ``dvc.yaml`` and the docs; the planning
code itself lives in :mod:`fedssl.plan`."""

from __future__ import annotations

import sys

from fedssl.plan.cli import main

if __name__ == "__main__":
    sys.exit(main())
