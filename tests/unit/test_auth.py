"""API keys: loading, the constant-time check, the Authorization header, and the middleware on a small app."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from edge.app import create_app
from edge.auth import OPEN_PATHS, ApiKeyAuth, KeyChecker, load_api_keys, open_paths, presented_key
from launcher.cli import build_parser, settings_from
from launcher.stack import LocalStack
from tritongate.config import ConfigError
from tritongate.settings import Settings


def test_a_comma_list_gives_each_key_once_without_blanks() -> None:
    assert load_api_keys(Settings(api_key=" k1, k2 ,,k1 ")) == ["k1", "k2"]


def test_a_key_file_skips_blank_lines_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team a\nk1\n\n   \n  k2  \n#k3\n")
    assert load_api_keys(Settings(api_key_file=path)) == ["k1", "k2"]


def test_keys_from_the_setting_and_the_file_add_up(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("k2\nk3\n")
    assert load_api_keys(Settings(api_key="k1,k2", api_key_file=path)) == ["k1", "k2", "k3"]


def test_no_key_configured_means_no_keys() -> None:
    assert load_api_keys(Settings()) == []
    assert load_api_keys(Settings(api_key="")) == []


def test_a_missing_or_empty_key_file_fails_instead_of_leaving_the_api_open(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_api_keys(Settings(api_key_file=tmp_path / "absent"))
    (tmp_path / "empty").write_text("# nothing yet\n\n")
    with pytest.raises(ConfigError, match="holds no keys"):
        load_api_keys(Settings(api_key_file=tmp_path / "empty"))


def test_keys_stay_out_of_the_settings_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONGATE_API_KEY", "sekrit-1,sekrit-2")
    settings = Settings()
    assert "sekrit" not in repr(settings) and "sekrit" not in str(settings.model_dump())
    assert load_api_keys(settings) == ["sekrit-1", "sekrit-2"]


def test_repeated_cli_flags_and_the_key_file_reach_the_settings(tmp_path: Path) -> None:
    args = build_parser().parse_args(["edge", "--api-key", "a", "--api-key", "b", "--api-key-file", str(tmp_path)])
    settings = settings_from(args)
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "a,b"
    assert settings.api_key_file == tmp_path
    assert build_parser().parse_args(["up", "--api-key", "c"]).api_key == ["c"]


def test_the_checker_accepts_exactly_the_configured_keys() -> None:
    checker = KeyChecker(["short", "a-much-longer-key-" * 4])
    assert checker.valid(b"short")
    assert checker.valid(("a-much-longer-key-" * 4).encode())
    for wrong in (b"", b"shor", b"short ", b"shortx", b"SHORT", b"a-much-longer-key-"):
        assert not checker.valid(wrong), wrong
    assert not KeyChecker([]).valid(b"")


@pytest.mark.parametrize(("value", "token"), [
    (b"Bearer k1", b"k1"), (b"bearer  k1 ", b"k1"), (b"BEARER k1", b"k1"),
    (b"Basic azE6", None), (b"Bearer", None), (b"Bearer   ", None), (b"k1", None),
])
def test_the_bearer_token_is_read_from_the_authorization_header(value: bytes, token: bytes | None) -> None:
    assert presented_key([(b"content-type", b"application/json"), (b"authorization", value)]) == token
    # Authorization wins over x-api-key wherever either comes.
    assert presented_key([(b"x-api-key", b"k2"), (b"authorization", value)]) == token
    assert presented_key([(b"authorization", value), (b"x-api-key", b"k2")]) == token


def test_anthropics_x_api_key_header_is_read_when_there_is_no_authorization() -> None:
    assert presented_key([(b"anthropic-version", b"2023-06-01"), (b"x-api-key", b" k1 ")]) == b"k1"
    assert presented_key([(b"x-api-key", b"")]) is None
    assert presented_key([(b"content-type", b"application/json")]) is None


def _client(metrics_require_key: bool = False) -> TestClient:
    app = FastAPI()

    @app.get("/v1/anything")
    async def anything() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    unprotected = open_paths(Settings(metrics_require_key=metrics_require_key))
    app.add_middleware(ApiKeyAuth, keys=["k1", "k2"], open_paths=unprotected)
    return TestClient(app)


def test_anthropics_routes_take_x_api_key_and_answer_401_in_anthropics_shape() -> None:
    client = _client()
    assert client.get("/v1/anything", headers={"x-api-key": "k2"}).status_code == 200
    response = client.post("/v1/messages", headers={"x-api-key": "wrong"})
    assert response.status_code == 401
    assert response.json() == {"type": "error", "error": {"type": "authentication_error",
                                                          "message": "Incorrect API key provided."}}


def test_the_middleware_answers_401_in_openai_shape_for_a_missing_or_wrong_key() -> None:
    client = _client()
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic azE="}):
        response = client.get("/v1/anything", headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"] == "Bearer"
        error = response.json()["error"]
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
        assert set(error) == {"message", "type", "param", "code"}
        assert "nope" not in response.text
    assert "didn't provide" in client.get("/v1/anything").json()["error"]["message"]
    wrong = client.get("/v1/anything", headers={"Authorization": "Bearer nope"})
    assert wrong.json()["error"]["message"] == "Incorrect API key provided."


def test_the_middleware_passes_a_right_key_and_the_open_paths() -> None:
    client = _client()
    for key in ("k1", "k2"):
        assert client.get("/v1/anything", headers={"Authorization": f"Bearer {key}"}).json() == {"ok": "yes"}
    assert client.get("/health").status_code == 200
    assert client.get("/no/such/path").status_code == 401  # deny before 404
    assert client.get("/no/such/path", headers={"Authorization": "Bearer k1"}).status_code == 404


def test_metrics_are_open_unless_metrics_require_key() -> None:
    assert "/metrics" in open_paths(Settings())
    assert "/metrics" not in open_paths(Settings(metrics_require_key=True))
    assert open_paths(Settings(metrics_require_key=True)) == OPEN_PATHS


def test_the_openapi_document_declares_the_bearer_scheme_on_protected_operations_only() -> None:
    schema = create_app(Settings(api_key="k1")).openapi()
    assert schema["components"]["securitySchemes"]["ApiKey"] == {"type": "http", "scheme": "bearer"}
    assert schema["paths"]["/v1/embeddings"]["post"]["security"] == [{"ApiKey": []}]
    assert "security" not in schema["paths"]["/health"]["get"]
    assert "securitySchemes" not in create_app(Settings()).openapi().get("components", {})


def test_the_local_stack_hands_keys_and_tls_settings_to_its_children(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    given = Settings(api_key="k1,k2", api_key_file=tmp_path / "keys", metrics_require_key=True,
                     grpc_tls_cert=tmp_path / "s.pem", grpc_tls_key=tmp_path / "s.key", grpc_tls_ca=tmp_path / "ca.pem",
                     grpc_tls_server_name="svc")
    for name in list(os.environ):
        monkeypatch.delenv(name)
    assert "TRITONGATE_API_KEY" not in LocalStack(Settings()).env()  # unset stays unset, not "None"
    for name, value in LocalStack(given).env().items():
        monkeypatch.setenv(name, value)
    child = Settings()
    assert child.api_key is not None and child.api_key.get_secret_value() == "k1,k2"
    fields = ("api_key_file", "metrics_require_key", "grpc_tls_cert", "grpc_tls_key", "grpc_tls_ca",
              "grpc_tls_server_name")
    assert {f: getattr(child, f) for f in fields} == {f: getattr(given, f) for f in fields}
