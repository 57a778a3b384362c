"""A Flower SuperLink that serves only what holds the deployment's credentials:
``python -m fedssl.flower superlink --credentials DIR --root PROJECT [--host H] [--port P]``.

It runs Flower's own ``flower-superlink`` with

- TLS on every API (``DIR/superlink.crt``, signed by ``DIR/ca.crt``);
- SuperNode authentication: only nodes whose public key was registered connect;
- the Control API (``flwr run``, ``flwr ls``, ``flwr supernode register``) closed to requests
  without the deployment's token (``DIR/control.token``; the SuperLink reads only its digest):
  Flower's open-source SuperLink accepts any caller there, so this plugs a bearer-token check
  into its account-authentication hook;
- its Runtime API (which Flower serves on the same port, for the SuperExec and ServerApp
  processes it starts on this machine) refused to any other machine: Flower guards its
  ``acquire-task`` call only in ``--isolation process`` mode;
- no installation of a submitted app's dependencies;
- the project root fixed here: the ServerApp runs the stage of the project at ``--root``
  (``FEDSSL_FLOWER_ROOT``), whatever the submitted run config says.

There is no ``--insecure``: a local simulation needs no SuperLink (``python -m stages.flower``).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import sys
from pathlib import Path

from fedssl.flower import credentials

ROOT_ENV = "FEDSSL_FLOWER_ROOT"
DEFAULT_PORT = 9093


def token_plugin(expected_digest: str):
    """A Control API authentication plugin accepting exactly the deployment's token."""
    from flwr.common.constant import ACCESS_TOKEN_KEY, NOOP_ACCOUNT_NAME, NOOP_FLWR_AID
    from flwr.supercore.auth.typing import AccountInfo
    from flwr.supercore.error import ApiErrorCode, FlowerError
    from flwr.superlink.auth_plugin import ControlAuthnPlugin

    class TokenAuthn(ControlAuthnPlugin):
        def __init__(self) -> None:
            self.digest = expected_digest

        def get_login_details(self):
            raise FlowerError(
                ApiErrorCode.NO_ACCOUNT_AUTH,
                "this SuperLink takes the deployment's token: python -m fedssl.flower connect",
            )

        def validate_tokens_in_metadata(self, metadata):
            given = dict(metadata).get(ACCESS_TOKEN_KEY)
            if isinstance(given, bytes):
                given = given.decode(errors="replace")
            if given and hmac.compare_digest(credentials.digest(given), self.digest):
                # the one account of Flower's open-source federation: the token's holder
                return True, AccountInfo(flwr_aid=NOOP_FLWR_AID, account_name=NOOP_ACCOUNT_NAME)
            return False, None

        def get_auth_tokens(self, device_code):
            return None

        def refresh_tokens(self, metadata):
            return None, None

    return TokenAuthn()


class LocalRuntimeOnly:
    """ASGI middleware: Runtime API requests (``/v1/runtime/``) from loopback addresses only."""

    PREFIX = "/v1/runtime/"

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(self.PREFIX):
            if not is_loopback((scope.get("client") or ("",))[0]):
                from starlette.responses import PlainTextResponse

                refused = PlainTextResponse("the Runtime API serves this machine only", 403)
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def flower_args(folder: Path, host: str, port: int, database: str | None) -> list[str]:
    """``flower-superlink``'s arguments: TLS, node authentication, no runtime installs."""
    args = [
        "--ssl-ca-certfile", str(folder / f"{credentials.CA}.crt"),
        "--ssl-certfile", str(folder / f"{credentials.SUPERLINK}.crt"),
        "--ssl-keyfile", str(folder / f"{credentials.SUPERLINK}.key"),
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--host", host,
        "--port", str(port),
    ]  # fmt: skip
    return args + (["--database", database] if database else [])


def serve(folder: Path, root: Path, host: str, port: int, database: str | None = None) -> None:
    """Run the SuperLink (blocks until it is stopped)."""
    import importlib

    from starlette.middleware import Middleware

    superlink = importlib.import_module("flwr.superlink.cli.flower_superlink")

    folder, root = Path(folder).resolve(), Path(root).resolve()
    missing = [
        f
        for f in (f"{credentials.CA}.crt", f"{credentials.SUPERLINK}.key", credentials.TOKEN_DIGEST)
        if not (folder / f).is_file()
    ]
    if missing:
        raise SystemExit(
            f"{folder} lacks {', '.join(missing)}: make the deployment's credentials first "
            f"(python -m fedssl.flower credentials {folder} --host NAME --nodes N)"
        )
    if not (root / "params").is_dir():
        raise SystemExit(f"--root {root} is not a fedssl project (it has no params/ folder)")
    expected = (folder / credentials.TOKEN_DIGEST).read_text().strip()
    superlink.load_control_authn_plugin = lambda: token_plugin(expected)
    extensions = importlib.import_module("flwr.superlink.extensions")
    outer = extensions.get_middleware
    extensions.get_middleware = lambda: (Middleware(LocalRuntimeOnly), *outer())
    os.environ[ROOT_ENV] = str(root)  # inherited by the SuperExec and its ServerApp processes
    sys.argv = ["flower-superlink", *flower_args(folder, host, port, database)]
    superlink.flower_superlink()
