"""A Flower deployment of fedssl, with TLS and authentication throughout
(docs/how-to/flower-two-machines.md):

    python -m fedssl.flower credentials [DIR] --host NAME --nodes N # CA, certificates, keys, token
    python -m fedssl.flower superlink --credentials DIR --root PROJECT [--host 0.0.0.0]
    python -m fedssl.flower supernode --credentials DIR --client K --root PROJECT --superlink H:P
    python -m fedssl.flower connect --credentials DIR [--superlink H:P]   # `flwr` may now submit
    python -m fedssl.flower submit --run-config "experiment='NAME'"       # flwr run, exit status

Run on one machine without any of this: ``python -m stages.flower STEP EXPERIMENT`` (Flower's
simulation engine, no network).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the backport Flower depends on
    import tomli as tomllib
from pathlib import Path

from fedssl.flower import credentials

APP = Path(__file__).parent / "flwr_app"  # the Flower app `flwr run` submits
CONNECTION = "fedssl"  # the name of Flower's SuperLink connection `connect` writes


def federation(app: Path = APP) -> dict:
    """The app's ``[tool.fedssl.federation]``: the SuperLink address and credentials folder."""
    config = tomllib.loads((Path(app) / "pyproject.toml").read_text())
    return config["tool"]["fedssl"]["federation"]


def supernode_command(folder: Path, client: int, root: Path, superlink: str, port: int) -> list:
    """``flower-supernode`` for client ``client``: TLS against the deployment's CA, signed in
    with the node's key, its project root fixed in its node config, its Runtime API (plain
    HTTP, no authentication in Flower's subprocess isolation) bound to loopback."""
    root = Path(root).resolve()
    if not (root / "params").is_dir():
        raise SystemExit(f"--root {root} is not a fedssl project (it has no params/ folder)")
    key = credentials.node_key(folder, client)
    if not key.is_file():
        raise SystemExit(f"{key} is missing: copy node {client}'s key from the credentials folder")
    return [
        shutil.which("flower-supernode") or "flower-supernode",
        "--root-certificates", str(Path(folder) / f"{credentials.CA}.crt"),
        "--auth-supernode-private-key", str(key),
        "--superlink", superlink,
        "--host", "127.0.0.1",  # its Runtime API: this machine's processes only
        "--port", str(port),
        "--node-config", f"partition-id={client} root='{root}'",
    ]  # fmt: skip


def connect(folder: Path, superlink: str) -> None:
    """Write Flower's SuperLink connection ``fedssl`` (TLS against the deployment's CA) and
    store the Control API token for it, so that ``flwr run``, ``flwr ls`` and ``flwr
    supernode register`` reach the SuperLink."""
    from flwr.cli.auth_plugin.oidc_cli_plugin import OidcCliPlugin
    from flwr.cli.flower_config import init_flwr_config, write_superlink_connection
    from flwr.cli.typing import SuperLinkConnection
    from flwr.supercore.auth.typing import AccountAuthCredentials

    folder = Path(folder).resolve()
    token = (folder / credentials.TOKEN).read_text().strip()
    init_flwr_config()
    write_superlink_connection(
        SuperLinkConnection(
            CONNECTION, superlink, str(folder / f"{credentials.CA}.crt"), insecure=False
        )
    )
    # Flower's CLI sends a stored access token as a bearer token (its OIDC plugin's store)
    OidcCliPlugin(superlink).store_tokens(AccountAuthCredentials(token, "none"))


def submit(app: Path, run_config: str | None) -> int:
    """``flwr run`` the app on connection ``fedssl``, streaming its log; the exit status is
    the run's: 0 only when it finished successfully."""
    from fedssl.flower.runs import run_and_wait

    return run_and_wait(app, CONNECTION, run_config)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m fedssl.flower", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    cr = sub.add_parser("credentials", help="make a CA, the SuperLink's certificate, node keys")
    fed = federation()
    folder = Path(fed["credentials"]).expanduser()  # outside the project: nothing to commit
    cr.add_argument("folder", type=Path, nargs="?", default=folder, help=f"default: {folder}")
    cr.add_argument("--host", action="append", default=[], help="a name or IP nodes dial")
    cr.add_argument("--nodes", type=int, required=True, help="node key pairs to make")
    for name, helptext in (
        ("superlink", "run the SuperLink (TLS, node authentication, token)"),
        ("supernode", "run SuperNode K (TLS, its key, its project root)"),
        ("connect", "let flwr reach the SuperLink (connection 'fedssl' + token)"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--credentials", type=Path, default=folder)
    sl, sn, co = (sub.choices[n] for n in ("superlink", "supernode", "connect"))
    sl.add_argument("--root", type=Path, required=True, help="the project the ServerApp runs")
    sl.add_argument("--host", default="127.0.0.1", help="0.0.0.0 for nodes on other machines")
    sl.add_argument("--port", type=int, default=int(fed["superlink"].rsplit(":", 1)[1]))
    sl.add_argument("--database", help="keep the SuperLink's state in this file")
    sn.add_argument("--client", type=int, required=True, help="the client this node is")
    sn.add_argument("--root", type=Path, required=True, help="this node's copy of the project")
    sn.add_argument("--superlink", default=fed["superlink"])
    sn.add_argument("--port", type=int, default=9094, help="its local ClientApp API port")
    co.add_argument("--superlink", default=fed["superlink"])
    su = sub.add_parser("submit", help="flwr run the app; exit non-zero when the run failed")
    su.add_argument("--app", type=Path, default=APP)
    su.add_argument("--run-config", help="e.g. \"experiment='fmnist_fedsimclr'\"")
    args = ap.parse_args(argv)

    if args.command == "credentials":
        folder = credentials.make(args.folder, args.host, args.nodes)
        print(f"wrote the deployment's credentials to {folder} (keep ca.key there)")
    elif args.command == "superlink":
        from fedssl.flower.superlink import serve

        serve(args.credentials, args.root, args.host, args.port, args.database)
    elif args.command == "supernode":
        cmd = supernode_command(args.credentials, args.client, args.root, args.superlink, args.port)
        os.execv(cmd[0], cmd)
    elif args.command == "connect":
        connect(args.credentials, args.superlink)
        print(f"flwr reaches {args.superlink} as connection '{CONNECTION}' (TLS, token)")
    else:
        sys.exit(submit(args.app, args.run_config))


if __name__ == "__main__":
    main()
