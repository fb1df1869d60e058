"""Triton addresses as the model configuration file writes them (`url`, `grpc_url`): `host:port`, with or
without the scheme Denglin's files put before it, or `dns:///host:port` for every address a DNS name
resolves to. A model's pool of Triton endpoints is built from them (services/common/triton_pool.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

# Triton's default HTTP port; embedding and rerank entries in the Denglin format point at it.
TRITON_HTTP_PORT = 8000
TRITON_GRPC_PORT = 8001
DNS_SCHEME = "dns:///"


def without_scheme(address: str) -> str:
    """`address` without the `grpc://`, `http://` or `https://` that Denglin's files may put before it."""
    return re.sub(r"^(grpc|https?)://", "", address).rstrip("/")


_HOST_PORT = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>[0-9]+))?")


@dataclass(frozen=True)
class TritonAddress:
    """One Triton gRPC endpoint of a model (`host:port`), or every address a DNS name resolves to
    (`dns:///host:port`, gRPC's spelling; what a Kubernetes headless Service needs), looked up again as
    they change."""

    host: str
    port: int
    dns: bool = False

    @property
    def host_port(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{DNS_SCHEME if self.dns else ''}{self.host_port}"


def parse_triton_address(text: str) -> TritonAddress:
    """`[grpc://|http://|https://]host[:port]` or `dns:///host[:port]` (port: Triton's gRPC port by
    default); ValueError saying what is wrong."""
    text = text.strip()
    dns = text.startswith(DNS_SCHEME)
    rest = text.removeprefix(DNS_SCHEME) if dns else without_scheme(text)
    if not dns and re.match(r"^[a-z][a-z0-9+.-]*:(?!\d)", rest):
        raise ValueError(f"`{text}`: write `host:port` or `{DNS_SCHEME}host:port` (a DNS name re-resolved "
                         "as its addresses change)")
    match = _HOST_PORT.fullmatch(rest)
    if match is None:
        raise ValueError(f"`{text}` is not `host:port` (IPv6 addresses in brackets: `[::1]:8001`)")
    port = int(match["port"] or TRITON_GRPC_PORT)
    if not 0 < port < 65536:
        raise ValueError(f"`{text}`: the port must be 1-65535")
    return TritonAddress(match["ipv6"] or match["host"], port, dns)


def address_list(value: str | Sequence[str]) -> list[str]:
    """The addresses of a `url` / `grpc_url`: a JSON list, or a string of them separated by commas."""
    return [item.strip() for item in (value.split(",") if isinstance(value, str) else value)]


def _check_addresses(value: str | list[str]) -> str | list[str]:
    items = address_list(value)
    seen: set[TritonAddress] = set()
    for i, item in enumerate(items):
        where = f"address {i + 1} of {len(items)}: " if len(items) > 1 else ""
        if not item:
            raise ValueError(f"{where}empty")
        try:
            address = parse_triton_address(item)
        except ValueError as exc:
            raise ValueError(f"{where}{exc}") from None
        if address in seen:
            raise ValueError(f"{where}`{item}` is listed twice")
        seen.add(address)
    return value


# Triton addresses, checked when the file is read (a bad one is an error naming its JSON path): `url`
# is a string (Denglin's format), `grpc_url` a JSON list or a string, separated by commas.
TritonAddresses = Annotated[str, Field(min_length=1), AfterValidator(_check_addresses)]
TritonAddressList = Annotated[list[str], BeforeValidator(lambda v: address_list(v) if isinstance(v, str) else v),
                              Field(min_length=1), AfterValidator(_check_addresses)]
