"""Image input on the whole stack: real PNG and JPEG files through the openai SDK (chat's `image_url` parts,
Responses' `input_image` parts) to vllm-echo's `image` input, which reports the files it received (type,
size, SHA-256) in the events file; /v1/models; and each bad input as its 400 naming the image's param,
on the session's edge (no hosts allowed) and on an edge of its own with small limits and loopback hosts
allowed."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from launcher.stack import LocalStack
from tests.support.events import events_offset, read_events
from tests.support.ports import free_port, wait_until
from tests.support.stack import spawn
from tritongate.registry import NAMES

VISION = "vllm-echo"  # declares vllm_backend's `image` input
TEXT_ONLY = "ft-echo"
QUESTION = "What is in the picture?"


def picture(kind: str, size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (20, 120, 200)).save(out, format=kind)
    return out.getvalue()


PNG, JPEG = picture("PNG", (8, 6)), picture("JPEG", (5, 7))


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def received(data: bytes, mime: str) -> dict[str, Any]:
    """What vllm-echo reports for a file it received."""
    return {"type": mime, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def image_events(events_file: Path, offset: int) -> list[list[dict[str, Any]]]:
    return [event["images"] for event in read_events(events_file, offset) if event["event"] == "images"]


def chat_body(*urls: str, model: str = VISION) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"model": model, "max_tokens": 4, "messages": [
        {"role": "system", "content": "Describe pictures."},
        {"role": "user", "content": [{"type": "text", "text": QUESTION}, *parts]}]}


def refusal(response: httpx.Response) -> tuple[int, str | None, str]:
    error = response.json()["error"]
    return response.status_code, error["param"], error["message"]


def test_a_png_and_a_jpeg_reach_the_model_through_chat(client: openai.OpenAI, events_file: Path) -> None:
    offset = events_offset(events_file)
    answer = client.chat.completions.create(
        model=VISION, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": QUESTION},
            {"type": "image_url", "image_url": {"url": data_url(PNG, "image/png")}},
            {"type": "image_url", "image_url": {"url": data_url(JPEG, "image/jpeg"), "detail": "low"}}]}])
    assert answer.choices[0].message.content  # the echo of the prompt's text
    assert image_events(events_file, offset) == [[received(PNG, "image/png"), received(JPEG, "image/jpeg")]]


def test_a_streamed_chat_with_an_image_streams(client: openai.OpenAI, events_file: Path) -> None:
    offset = events_offset(events_file)
    stream = client.chat.completions.create(model=VISION, max_tokens=4, stream=True, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(JPEG, "image/jpeg")}},
                                     {"type": "text", "text": QUESTION}]}])
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text
    assert image_events(events_file, offset) == [[received(JPEG, "image/jpeg")]]


def test_responses_input_image_takes_the_same_path(client: openai.OpenAI, events_file: Path) -> None:
    offset = events_offset(events_file)
    response = client.responses.create(model=VISION, max_output_tokens=4, input=[{"role": "user", "content": [
        {"type": "input_text", "text": QUESTION},
        {"type": "input_image", "image_url": data_url(PNG, "image/png"), "detail": "auto"}]}])
    assert response.output_text
    # The next turn replays the stored conversation, image included.
    follow = client.responses.create(model=VISION, max_output_tokens=4, previous_response_id=response.id,
                                     input="And its colour?")
    assert follow.output_text
    assert image_events(events_file, offset) == [[received(PNG, "image/png")], [received(PNG, "image/png")]]


def test_models_say_which_take_images(http: httpx.Client) -> None:
    models = {model["id"]: model for model in http.get("/v1/models").json()["data"]}
    assert models[VISION]["image_input"] is True
    assert models[TEXT_ONLY]["image_input"] is False


def test_what_is_not_an_image_is_refused(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=chat_body(data_url(b"%PDF-1.7\n", "image/png")))
    assert refusal(response) == (400, "messages[1].content[1].image_url.url",
                                 "'messages[1].content[1].image_url.url' is not an image: expected PNG, JPEG, "
                                 "GIF or WebP")


def test_a_model_without_image_input_is_refused_naming_the_part(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=chat_body(data_url(PNG, "image/png"), model=TEXT_ONLY))
    status, param, message = refusal(response)
    assert (status, param) == (400, "messages[1].content[1].image_url.url") and "does not take images" in message


def test_an_http_url_is_refused_when_no_host_is_allowed(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=chat_body("https://example.com/cat.png"))
    status, param, message = refusal(response)
    assert (status, param) == (400, "messages[1].content[1].image_url.url") and "data: URLs" in message


class ImageServer:
    """A real HTTP server on loopback: /image.png, and /redirect?to=URL."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/redirect?to="):
                    self.send_response(302)
                    self.send_header("Location", self.path.removeprefix("/redirect?to="))
                    self.end_headers()
                    return
                self.send_response(200 if self.path == "/image.png" else 404)
                self.send_header("Content-Length", str(len(PNG)))
                self.end_headers()
                self.wfile.write(PNG)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def image_server() -> Iterator[ImageServer]:
    server = ImageServer()
    yield server
    server.httpd.shutdown()


@pytest.fixture(scope="module")
def strict_edge(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An edge on the stack's services: images up to 2,000 bytes, two a request, fetched from 127.0.0.1 and
    127.0.0.2, of which only 127.0.0.1 is an allowed private network."""
    port = free_port()
    env = dict(os.environ, TRITONGATE_IMAGE_MAX_BYTES="2000", TRITONGATE_IMAGE_MAX_COUNT="2",
               TRITONGATE_IMAGE_ALLOWED_HOSTS='["127.0.0.1", "127.0.0.2"]',
               TRITONGATE_IMAGE_ALLOWED_NETWORKS='["127.0.0.1/32"]')
    targets = [f"--{name}={stack.service_address(name)}" for name in NAMES]
    process = spawn(["edge", "--port", str(port), *targets], env, tmp_path_factory.mktemp("images") / "edge.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url), 60, "the edge", process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_an_allowed_host_is_fetched(strict_edge: str, image_server: ImageServer, events_file: Path) -> None:
    offset = events_offset(events_file)
    client = openai.OpenAI(base_url=f"{strict_edge}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(model=VISION, max_tokens=4, messages=[{"role": "user", "content": [
        {"type": "text", "text": QUESTION},
        {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{image_server.port}/image.png"}}]}])
    assert answer.choices[0].message.content
    assert image_events(events_file, offset) == [[received(PNG, "image/png")]]


def test_an_allowed_host_that_redirects_to_a_private_address_is_refused(strict_edge: str,
                                                                        image_server: ImageServer) -> None:
    target = f"http://127.0.0.2:{image_server.port}/image.png"  # an allowed host, outside the allowed networks
    body = chat_body(f"http://127.0.0.1:{image_server.port}/redirect?to={target}")
    status, param, message = refusal(httpx.post(f"{strict_edge}/v1/chat/completions", json=body, timeout=30))
    assert (status, param) == (400, "messages[1].content[1].image_url.url")
    assert "`127.0.0.2` is at a private address" in message


def test_an_image_over_the_size_limit_is_refused(strict_edge: str) -> None:
    out = io.BytesIO()
    Image.frombytes("RGB", (32, 32), os.urandom(32 * 32 * 3)).save(out, format="PNG")  # noise: no compression
    large = out.getvalue()
    assert len(large) > 2000
    response = httpx.post(f"{strict_edge}/v1/chat/completions", json=chat_body(data_url(large, "image/png")))
    status, param, message = refusal(response)
    assert (status, param) == (400, "messages[1].content[1].image_url.url") and "2000 bytes" in message


def test_too_many_images_are_refused(strict_edge: str) -> None:
    url = data_url(PNG, "image/png")
    response = httpx.post(f"{strict_edge}/v1/chat/completions", json=chat_body(url, url, url))
    status, param, message = refusal(response)
    assert (status, param) == (400, "messages[1].content[3].image_url.url") and "at most 2 images" in message


def test_anthropic_image_blocks_take_the_same_path(stack: LocalStack, events_file: Path) -> None:
    """The anthropic SDK's base64 image blocks reach the model as chat's do; on a text-only model the 400
    names the block's data, in Anthropic's error shape."""
    import anthropic

    claude = anthropic.Anthropic(base_url=stack.edge_url, api_key="unused", max_retries=0, timeout=300)
    blocks: Any = [{"type": "text", "text": QUESTION},
                   {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                "data": base64.b64encode(PNG).decode()}}]
    offset = events_offset(events_file)
    message = claude.messages.create(model=VISION, max_tokens=4, messages=[{"role": "user", "content": blocks}])
    assert message.content and message.stop_reason in ("end_turn", "max_tokens")
    assert image_events(events_file, offset) == [[received(PNG, "image/png")]]
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=TEXT_ONLY, max_tokens=4, messages=[{"role": "user", "content": blocks}])
    assert refused.value.body["type"] == "error"  # type: ignore[index]
    assert "messages[0].content[1].source.data" in refused.value.body["error"]["message"]  # type: ignore[index]
