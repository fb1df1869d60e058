"""A model's Triton address in the model configuration: one endpoint or several (a JSON list, or separated
by commas), DNS names written `dns:///host:port`, Denglin's `url` unchanged, and a bad address an error
at start-up that names its JSON path."""

from __future__ import annotations

from typing import Any

import pytest

from tritongate.config import ConfigError, parse_model_config
from tritongate.triton_address import TritonAddress


def entry(**fields: Any) -> Any:
    return parse_model_config({"embedding": [{"name": "e", "path": "/m", **fields}]}).embedding[0]


@pytest.mark.parametrize(("fields", "addresses"), [
    # Denglin's format: one `url`, Triton's HTTP port meaning the same host's gRPC port.
    ({"url": "127.0.0.1:8000"}, ["127.0.0.1:8001"]),
    ({"url": "http://triton:8000/"}, ["triton:8001"]),
    ({"url": "triton"}, ["triton:8001"]),  # Triton's gRPC port by default
    ({"url": "a:8000,b:9001"}, ["a:8001", "b:9001"]),
    ({"url": "u", "grpc_url": "a:1, b:2"}, ["a:1", "b:2"]),
    ({"url": "u", "grpc_url": ["a:1", "grpc://b:2", "[::1]:3"]}, ["a:1", "b:2", "[::1]:3"]),
    ({"url": "u", "grpc_url": "dns:///triton-headless:8001"}, ["dns:///triton-headless:8001"]),
    ({"url": "dns:///triton:8000"}, ["dns:///triton:8001"]),
    ({"url": "u", "grpc_url": ["dns:///triton", "10.0.0.9:8001"]}, ["dns:///triton:8001", "10.0.0.9:8001"]),
])
def test_addresses_name_one_endpoint_or_several(fields: dict[str, Any], addresses: list[str]) -> None:
    model = entry(**fields)
    assert [str(address) for address in model.triton_addresses] == addresses
    assert model.triton_grpc_url == ",".join(addresses)


def test_a_dns_address_is_looked_up_an_ip_literal_is_not() -> None:
    dns, fixed = entry(url="u", grpc_url="dns:///triton:8001,[fd00::1]:8001").triton_addresses
    assert dns == TritonAddress("triton", 8001, dns=True)
    assert fixed == TritonAddress("fd00::1", 8001) and fixed.host_port == "[fd00::1]:8001"


@pytest.mark.parametrize(("fields", "expected"), [
    ({"url": "u", "grpc_url": "h:99999"}, "$.embedding[0].grpc_url: Value error, `h:99999`: the port must be 1-65535"),
    ({"url": "u", "grpc_url": ["a:1", "b c"]},
     "$.embedding[0].grpc_url: Value error, address 2 of 2: `b c` is not `host:port`"),
    ({"url": "u", "grpc_url": "a:1,,b:2"}, "$.embedding[0].grpc_url: Value error, address 2 of 3: empty"),
    ({"url": "u", "grpc_url": "a:1,a:1"}, "address 2 of 2: `a:1` is listed twice"),
    ({"url": "u", "grpc_url": "dns://resolver/triton:8001"}, "write `host:port` or `dns:///host:port`"),
    ({"url": "u", "grpc_url": "ipv4:10.0.0.1:8001"}, "`ipv4:10.0.0.1:8001` is not `host:port`"),
    ({"url": "u", "grpc_url": "::1"}, "IPv6 addresses in brackets"),
    ({"url": "u", "grpc_url": []}, "$.embedding[0].grpc_url: Value should have at least 1 item"),
    ({"url": "u", "grpc_url": 8001}, "$.embedding[0].grpc_url: Input should be a valid list"),
    ({"url": "h:0"}, "$.embedding[0].url: Value error, `h:0`: the port must be 1-65535"),
    ({"url": "a,b:x"}, "$.embedding[0].url: Value error, address 2 of 2: `b:x`"),
])
def test_a_bad_address_is_a_configuration_error_naming_its_path(fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_model_config({"embedding": [{"name": "e", "path": "/m", **fields}]}, "model_config.json")
    assert str(info.value).startswith("model_config.json: ")
    assert expected in str(info.value)
