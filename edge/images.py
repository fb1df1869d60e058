"""Images in chat messages: a client's image URL (`data:` or, for the hosts the operator allows, `http(s)`)
turned into the bytes the llm service passes to a model that takes images (`llm.v1.Image`).

The endpoints collect each image as a `PendingImage` (its message, URL and the client's parameter path,
`messages[0].content[1].image_url.url`) while they validate the request; `attach` loads them all before
the generation starts, once the model is known to take images. Every refusal is a `ParamError` naming
that path (400).

Fetching must not turn the edge into a way into the network it runs in: only hosts of
`image_allowed_hosts`, only to addresses that are public (or inside `image_allowed_networks`), every
redirect checked the same way, the connection pinned to the address that was checked (so a second DNS
answer cannot swap it), no proxy from the environment, a size limit while reading and one timeout for
all of it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

import httpx

from edge.errors import ParamError
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2
from tritongate.settings import Settings

MAX_REDIRECTS = 3
# The formats every multimodal model's image processor reads, by their first bytes.
MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF87a", "image/gif"),
         (b"GIF89a", "image/gif"))
FORMATS = "PNG, JPEG, GIF or WebP"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int
    max_count: int
    allowed_hosts: frozenset[str]
    allowed_networks: tuple[Network, ...]
    timeout_s: float

    @classmethod
    def of(cls, settings: Settings) -> ImageLimits:
        return cls(settings.image_max_bytes, settings.image_max_count,
                   frozenset(host.lower() for host in settings.image_allowed_hosts),
                   tuple(ipaddress.ip_network(net, strict=False) for net in settings.image_allowed_networks),
                   settings.image_fetch_timeout_s)


@dataclass(frozen=True)
class PendingImage:
    """An image a message names, not loaded yet: `attach` appends it to `message.images`."""

    message: llm_pb2.ChatMessage
    url: str
    param: str


def sniff(data: bytes) -> str | None:
    """The image's media type from its first bytes; None when it is none of FORMATS."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((mime for magic, mime in MAGIC if data.startswith(magic)), None)


def chat_part_url(part: dict[str, Any]) -> Any:
    """The URL of chat's `image_url` part: {"image_url": {"url": ...}} (some clients send the string)."""
    value = part.get("image_url")
    return value.get("url") if isinstance(value, dict) else value


async def load_image(url: str, param: str, limits: ImageLimits) -> llm_pb2.Image:
    """An image URL (`data:`, or `http(s)` from an allowed host) as a checked image; ParamError(param) if not."""
    if not isinstance(url, str) or not url:
        raise ParamError(f"'{param}' must be a non-empty string (a data: or http(s) URL)", param)
    scheme = url.split(":", 1)[0].lower()
    if scheme == "data":
        data = data_url_bytes(url, param, limits)
    elif scheme in ("http", "https"):
        if not limits.allowed_hosts:
            raise ParamError(f"'{param}': this server takes images only as data: URLs (base64); it fetches no "
                             "http(s) URLs", param)
        try:
            async with asyncio.timeout(limits.timeout_s):
                data = await _fetch(url, param, limits)
        except TimeoutError:
            raise ParamError(f"'{param}': fetching the image took longer than {limits.timeout_s:g} s", param) from None
    else:
        raise ParamError(f"'{param}' must be a data: or http(s) URL", param)
    return checked(data, param)


def checked(data: bytes, param: str) -> llm_pb2.Image:
    mime = sniff(data)
    if mime is None:
        raise ParamError(f"'{param}' is not an image: expected {FORMATS}", param)
    return llm_pb2.Image(data=data, mime_type=mime)


def data_url_bytes(url: str, param: str, limits: ImageLimits) -> bytes:
    """The bytes of a `data:[<type>][;base64],<data>` URL, refused before decoding when too large."""
    head, sep, payload = url[5:].partition(",")
    if not sep:
        raise ParamError(f"'{param}' is not a valid data: URL (no ',' before the data)", param)
    if len(payload) * 3 // 4 > limits.max_bytes + 2 or (not head.endswith(";base64") and
                                                        len(payload) > 3 * limits.max_bytes):
        raise _too_large(param, limits)
    if head.endswith(";base64"):
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise ParamError(f"'{param}': the data: URL's base64 data is not valid base64", param) from None
    else:
        data = unquote_to_bytes(payload)
    if len(data) > limits.max_bytes:
        raise _too_large(param, limits)
    return data


def _too_large(param: str, limits: ImageLimits) -> ParamError:
    return ParamError(f"'{param}': the image is larger than this server's limit of {limits.max_bytes} bytes", param)


async def _address(host: str, port: int, param: str, limits: ImageLimits) -> str:
    """The address to connect to: every address `host` resolves to must be public, or allowed."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise ParamError(f"'{param}': the image's host `{host}` was not found", param) from None
    addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
    for address in addresses:
        plain = address.ipv4_mapped or address if isinstance(address, ipaddress.IPv6Address) else address
        if not plain.is_global and not any(plain in net for net in limits.allowed_networks):
            raise ParamError(f"'{param}': the image's host `{host}` is at a private address, which this server "
                             "does not fetch from", param)
    return str(addresses[0])


async def _fetch(url: str, param: str, limits: ImageLimits) -> bytes:
    """GET `url` from an allowed host, following redirects only to allowed hosts, at most max_bytes."""
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            try:
                target = httpx.URL(url)
            except httpx.InvalidURL:
                raise ParamError(f"'{param}': `{url}` is not a valid URL", param) from None
            host = target.host.lower()
            if target.scheme not in ("http", "https") or host not in limits.allowed_hosts:
                raise ParamError(f"'{param}': this server does not fetch images from `{host or url}` (not one of "
                                 "its allowed hosts)", param)
            address = await _address(host, target.port or (443 if target.scheme == "https" else 80), param, limits)
            # Connect to the checked address; the Host header and TLS (SNI, certificate) keep the name.
            pinned = target.copy_with(host=address)
            headers = {"Host": target.netloc.decode("ascii"), "Accept": "image/*"}
            try:
                async with client.stream("GET", pinned, headers=headers,
                                         extensions={"sni_hostname": host}) as response:
                    if response.is_redirect:
                        url = str(target.join(response.headers.get("location", "")))
                        continue
                    if response.status_code != 200:
                        raise ParamError(f"'{param}': fetching the image answered HTTP {response.status_code}", param)
                    if int(response.headers.get("content-length") or 0) > limits.max_bytes:
                        raise _too_large(param, limits)
                    data = bytearray()
                    async for chunk in response.aiter_bytes():
                        data += chunk
                        if len(data) > limits.max_bytes:
                            raise _too_large(param, limits)
                    return bytes(data)
            except httpx.HTTPError as exc:
                raise ParamError(f"'{param}': fetching the image failed ({type(exc).__name__})", param) from None
    raise ParamError(f"'{param}': fetching the image was redirected more than {MAX_REDIRECTS} times", param)


async def attach(pending: Sequence[PendingImage], card: common_pb2.ModelCard, limits: ImageLimits) -> None:
    """Load every pending image into its message; refused when too many, or the model takes none."""
    if not pending:
        return
    if len(pending) > limits.max_count:
        raise ParamError(f"'{pending[limits.max_count].param}': a request may carry at most {limits.max_count} "
                         "images", pending[limits.max_count].param)
    if not card.image_input:
        raise ParamError(f"'{pending[0].param}': model `{card.id}` does not take images", pending[0].param)
    images = await asyncio.gather(*(load_image(image.url, image.param, limits) for image in pending))
    for image, loaded in zip(pending, images, strict=True):
        image.message.images.append(loaded)
