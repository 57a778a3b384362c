"""The pieces of the Flower deployment's security, without a network (the deployment itself:
tests/flower/test_flower_local.py, opt-in): the credentials the project makes (a CA, the SuperLink's
certificate for the names nodes dial, node keys Flower accepts, a token kept only as a digest
on the SuperLink), the Control API token check, the Runtime API closed to other machines, and
the deployment's refusal of a run without a project root (a node that differs:
tests/flower/test_flower_deploy.py)."""

from __future__ import annotations

import asyncio
import stat

import pytest

pytest.importorskip("flwr")

from fedssl.flower import credentials  # noqa: E402
from fedssl.flower.superlink import LocalRuntimeOnly, token_plugin  # noqa: E402
from fedssl.stage.runtime import StageFailed  # noqa: E402


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return credentials.make(
        tmp_path_factory.mktemp("cred") / "c", ["node-a.example", "192.0.2.7"], nodes=2
    )


def test_the_superlink_certificate_is_signed_by_the_ca_for_the_names_dialled(made):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    ca = x509.load_pem_x509_certificate((made / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((made / "superlink.crt").read_bytes())
    cert.verify_directly_issued_by(ca)  # raises if not
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "node-a.example"}
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "192.0.2.7",
    }
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert isinstance(cert.public_key().curve, ec.SECP384R1)


def test_node_keys_are_what_flower_loads_and_secrets_are_private(made):
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key

    for k in (0, 1):
        key = load_ssh_private_key(credentials.node_key(made, k).read_bytes(), None)
        assert key.curve.name == "secp384r1"
        assert try_load_public_key(made / f"node-{k}.pub")  # as `flwr supernode register`
    for secret in ("ca.key", "superlink.key", "node-0.key", "control.token"):
        assert stat.S_IMODE((made / secret).stat().st_mode) == 0o600, secret
    token = (made / "control.token").read_text()
    assert (made / "control.sha256").read_text() == credentials.digest(token)
    assert token not in (made / "control.sha256").read_text()
    with pytest.raises(FileExistsError, match="already holds credentials"):
        credentials.make(made, [], nodes=1)


def test_the_control_api_accepts_the_token_and_nothing_else(made):
    from flwr.common.constant import ACCESS_TOKEN_KEY

    plugin = token_plugin((made / "control.sha256").read_text())
    token = (made / "control.token").read_text()
    ok, account = plugin.validate_tokens_in_metadata([(ACCESS_TOKEN_KEY, token)])
    assert ok and account is not None
    for given in ([], [(ACCESS_TOKEN_KEY, token[:-1])], [(ACCESS_TOKEN_KEY, "")]):
        assert plugin.validate_tokens_in_metadata(given) == (False, None)
    assert plugin.refresh_tokens([]) == (None, None) and plugin.get_auth_tokens("x") is None


def asgi(app, path: str, client: str) -> int:
    """The status ``app`` answers a request for ``path`` from ``client``."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "client": (client, 40000), "method": "POST",
             "headers": [], "query_string": b""}  # fmt: skip
    asyncio.run(app(scope, receive, send))
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


def test_the_runtime_api_answers_this_machine_only():
    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = LocalRuntimeOnly(inner)
    assert asgi(app, "/v1/runtime/acquire-task", "192.0.2.9") == 403
    assert asgi(app, "/v1/runtime/acquire-task", "not-an-address") == 403
    assert asgi(app, "/v1/runtime/acquire-task", "127.0.0.1") == 200
    assert asgi(app, "/v1/runtime/acquire-task", "::1") == 200
    assert asgi(app, "/v1/fleet/activate-node", "192.0.2.9") == 200  # nodes: authenticated


def test_the_server_app_runs_only_under_a_root_fixed_at_superlink_start(monkeypatch):
    from fedssl.flower.deploy import server_root, step_of
    from fedssl.flower.superlink import ROOT_ENV

    monkeypatch.delenv(ROOT_ENV, raising=False)
    with pytest.raises(StageFailed, match="no project root"):
        server_root()
    monkeypatch.setenv(ROOT_ENV, "/fixed/at/start")
    assert str(server_root()) == "/fixed/at/start"

    class Run:
        run_config = {"step": "pretrain", "root": "/elsewhere"}

    with pytest.raises(StageFailed, match="lacks experiment"):
        step_of(Run())


def test_the_fedssl_command_makes_the_credentials(tmp_path, capsys):
    from fedssl.cli import run

    run(["flower", "credentials", str(tmp_path / "c"), "--host", "h.example", "--nodes", "3"])
    assert "wrote the deployment's credentials" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "c").glob("node-*.pub")) == [
        "node-0.pub",
        "node-1.pub",
        "node-2.pub",
    ]
