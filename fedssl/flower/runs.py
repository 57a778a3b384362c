"""Submitting a run with ``flwr run`` and ending with the run's own status: ``flwr run``
exits 0 whether the run completed or failed, so this asks the SuperLink how it ended."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

STARTED = re.compile(r"Successfully started run (\d+)")


def run_and_wait(app: Path, connection: str, run_config: str | None) -> int:
    """Stream the run's log; 0 when it finished completed, else 1 after one line saying how
    it ended."""
    cmd = ["flwr", "run", str(app), connection, "--stream"]
    if run_config:
        cmd += ["--run-config", run_config]
    run_id = None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if run_id is None and (m := STARTED.search(line)):
                run_id = m.group(1)
    if run_id is None:
        print(f"flwr run did not start a run (exit status {p.returncode})", file=sys.stderr)
        return p.returncode or 1
    status, details = run_status(connection, run_id)
    if status == "finished:completed":
        return 0
    print(f"run {run_id} {status}: {details}", file=sys.stderr)
    return 1


def run_status(connection: str, run_id: str) -> tuple[str, str]:
    out = subprocess.run(
        ["flwr", "ls", connection, "--run-id", run_id, "--format", "json"],
        capture_output=True,
        text=True,
    ).stdout
    try:
        run = json.loads(out)["runs"][0]
    except (ValueError, KeyError, IndexError):
        return "unknown", f"flwr ls answered: {out.strip()[-300:]}"
    return run["status"], run.get("status-details", "")
