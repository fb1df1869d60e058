"""Image input: the edge's loading and checks (edge/images.py: `data:` URLs, fetching from allowed
hosts through a real local HTTP server, private addresses, redirects, limits), where chat and Responses
name each image, and the service's side (the template's content parts, vLLM's `image` tensor)."""

from __future__ import annotations

import base64
import hashlib
import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from PIL import Image

from edge.endpoints.chat import ChatCompletionRequest, generation_input
from edge.endpoints.response_input import input_messages
from edge.endpoints.responses import Stored
from edge.errors import ParamError
from edge.images import ImageLimits, attach, load_image, sniff
from services.llm.backends import Sampling
from services.llm.tools import template_messages
from services.llm.vllm import Vllm
from tests.support.fake_triton import triton_config
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2
from tritongate.settings import Settings

PARAM = "messages[0].content[1].image_url.url"


def picture(kind: str, size: tuple[int, int] = (8, 6)) -> bytes:
    """A real image file, made here (Pillow)."""
    out = io.BytesIO()
    Image.new("RGB", size, (200, 30, 90)).save(out, format=kind)
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def limits(**overrides: Any) -> ImageLimits:
    return ImageLimits.of(Settings(**overrides))


def refusal(error: pytest.ExceptionInfo[ParamError]) -> tuple[str | None, str]:
    return error.value.param, error.value.message


@pytest.mark.parametrize(("kind", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("GIF", "image/gif"),
                                            ("WEBP", "image/webp")])
def test_each_format_is_sniffed_from_its_bytes(kind: str, mime: str) -> None:
    assert sniff(picture(kind)) == mime


async def test_a_data_url_becomes_the_image_its_type_sniffed_not_declared() -> None:
    png = picture("PNG")
    image = await load_image(data_url(png, "image/jpeg"), PARAM, limits())
    assert image.data == png and image.mime_type == "image/png"


async def test_what_is_not_an_image_is_refused_by_its_param() -> None:
    with pytest.raises(ParamError) as error:
        await load_image(data_url(b"%PDF-1.7 not a picture", "image/png"), PARAM, limits())
    param, message = refusal(error)
    assert param == PARAM and "not an image" in message
    with pytest.raises(ParamError) as error:
        await load_image("data:image/png;base64,@@@", PARAM, limits())
    assert refusal(error)[0] == PARAM and "base64" in refusal(error)[1]
    with pytest.raises(ParamError) as error:
        await load_image("file:///etc/passwd", PARAM, limits())
    assert refusal(error)[0] == PARAM


async def test_an_image_over_the_size_limit_is_refused() -> None:
    png = picture("PNG", (64, 64))
    assert (await load_image(data_url(png), PARAM, limits(image_max_bytes=len(png)))).data == png
    with pytest.raises(ParamError) as error:
        await load_image(data_url(png), PARAM, limits(image_max_bytes=len(png) - 1))
    assert refusal(error)[0] == PARAM and f"limit of {len(png) - 1} bytes" in refusal(error)[1]


async def test_http_urls_are_refused_when_no_host_is_allowed() -> None:
    with pytest.raises(ParamError) as error:
        await load_image("https://example.com/cat.png", PARAM, limits())
    assert refusal(error)[0] == PARAM and "data: URLs" in refusal(error)[1]


class Server:
    """A real HTTP server on a loopback port: /image.png, /redirect?to=URL, /big.png."""

    def __init__(self, png: bytes) -> None:
        outer = self
        self.requests: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append(self.path)
                if self.path.startswith("/redirect?to="):
                    self.send_response(302)
                    self.send_header("Location", self.path.removeprefix("/redirect?to="))
                    self.end_headers()
                    return
                body = png if self.path == "/image.png" else b"x" * 4096
                self.send_response(200 if self.path in ("/image.png", "/big.png") else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server(picture("PNG"))
    yield running
    running.httpd.shutdown()


def loopback(**overrides: Any) -> ImageLimits:
    """127.0.0.1 allowed as a host and, explicitly, as a private network."""
    return limits(image_allowed_hosts=["127.0.0.1", "127.0.0.2"], image_allowed_networks=["127.0.0.1/32"],
                  **overrides)


async def test_an_allowed_host_is_fetched(server: Server) -> None:
    image = await load_image(f"{server.url}/image.png", PARAM, loopback())
    assert image.mime_type == "image/png" and hashlib.sha256(image.data).digest() == \
        hashlib.sha256(picture("PNG")).digest()


async def test_a_private_address_is_refused_unless_its_network_is_allowed(server: Server) -> None:
    with pytest.raises(ParamError) as error:
        await load_image(f"{server.url}/image.png", PARAM, limits(image_allowed_hosts=["127.0.0.1"]))
    assert refusal(error)[0] == PARAM and "private address" in refusal(error)[1]
    assert server.requests == []  # refused before connecting


async def test_a_redirect_to_a_private_address_is_refused(server: Server) -> None:
    target = f"http://127.0.0.2:{server.httpd.server_address[1]}/image.png"  # an allowed host, a private address
    with pytest.raises(ParamError) as error:
        await load_image(f"{server.url}/redirect?to={target}", PARAM, loopback())
    assert refusal(error)[0] == PARAM and "`127.0.0.2` is at a private address" in refusal(error)[1]
    assert server.requests == [f"/redirect?to={target}"]


async def test_a_redirect_to_another_host_is_refused_and_one_to_an_allowed_host_followed(server: Server) -> None:
    with pytest.raises(ParamError) as error:
        await load_image(f"{server.url}/redirect?to=http://example.com/x.png", PARAM, loopback())
    assert "`example.com`" in refusal(error)[1] and "allowed hosts" in refusal(error)[1]
    image = await load_image(f"{server.url}/redirect?to=/image.png", PARAM, loopback())
    assert image.mime_type == "image/png"


async def test_a_fetched_image_over_the_limit_or_not_found_is_refused(server: Server) -> None:
    with pytest.raises(ParamError) as error:
        await load_image(f"{server.url}/big.png", PARAM, loopback(image_max_bytes=1000))
    assert "limit of 1000 bytes" in refusal(error)[1]
    with pytest.raises(ParamError) as error:
        await load_image(f"{server.url}/missing.png", PARAM, loopback())
    assert "HTTP 404" in refusal(error)[1]


def chat(*parts: dict[str, Any], role: str = "user") -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                    {"role": role, "content": [{"type": "text", "text": "What is it?"}, *parts]}]})


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


async def test_chat_names_each_image_by_its_place_and_attach_loads_them_in_order() -> None:
    png, jpeg = picture("PNG"), picture("JPEG")
    generation = generation_input(chat(image_part(data_url(png)), image_part(data_url(jpeg, "image/jpeg"))))
    assert [image.param for image in generation.images] == ["messages[1].content[1].image_url.url",
                                                            "messages[1].content[2].image_url.url"]
    assert generation.messages[1].content == "What is it?"
    await attach(generation.images, common_pb2.ModelCard(id="m", image_input=True), limits())
    sent = generation.proto().chat.messages[1]
    assert [image.data for image in sent.images] == [png, jpeg]
    assert [image.mime_type for image in sent.images] == ["image/png", "image/jpeg"]


async def test_too_many_images_or_a_model_without_image_input_is_refused_by_the_image_param() -> None:
    url = data_url(picture("PNG"))
    generation = generation_input(chat(*[image_part(url)] * 3))
    with pytest.raises(ParamError) as error:
        await attach(generation.images, common_pb2.ModelCard(id="m", image_input=True), limits(image_max_count=2))
    assert refusal(error)[0] == "messages[1].content[3].image_url.url" and "at most 2 images" in refusal(error)[1]
    with pytest.raises(ParamError) as error:
        await attach(generation.images, common_pb2.ModelCard(id="text-only"), limits())
    assert refusal(error)[0] == "messages[1].content[1].image_url.url"
    assert "`text-only` does not take images" in refusal(error)[1]


def test_image_parts_only_in_user_messages() -> None:
    with pytest.raises(ValueError, match="image_url parts in user messages"):
        chat(image_part(data_url(picture("PNG"))), role="assistant")


async def test_responses_input_image_items_take_the_same_path_and_are_stored_with_their_bytes() -> None:
    png = picture("PNG")
    parsed = input_messages([{"role": "user", "content": [{"type": "input_text", "text": "What is it?"},
                                                          {"type": "input_image", "image_url": data_url(png)}]}])
    assert [image.param for image in parsed.images] == ["input[0].content[1].image_url"]
    await attach(parsed.images, common_pb2.ModelCard(id="m", image_input=True), limits())
    conversation = Stored.decoded(Stored({"id": "resp-1"}, parsed.messages).encoded()).conversation
    assert conversation is not None
    stored = conversation[0]
    assert stored.content == "What is it?" and [(i.data, i.mime_type) for i in stored.images] == [(png, "image/png")]
    with pytest.raises(ParamError) as error:
        input_messages([{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}])
    assert refusal(error)[0] == "input[0].content[0].image_url"


def test_a_template_that_places_images_gets_content_parts_others_the_text() -> None:
    message = llm_pb2.ChatMessage(role="user", content="What is it?",
                                  images=[llm_pb2.Image(data=b"1", mime_type="image/png")] * 2)
    conversation = llm_pb2.Chat(messages=[message])
    assert template_messages(conversation, native=True)[0]["content"] == "What is it?"
    assert template_messages(conversation, native=True, images=True)[0]["content"] == [
        {"type": "image"}, {"type": "image"}, {"type": "text", "text": "What is it?"}]


def test_vllm_sends_base64_images_only_where_the_model_declares_the_image_input() -> None:
    declared = {"text_input": "STRING", "image": "STRING", "sampling_parameters": "STRING", "stream": "BOOL"}
    vllm = Vllm(None, None, "m")  # type: ignore[arg-type]  # (tensors and knobs need no Triton)
    vllm.configure(triton_config(declared, {"text_output": "STRING"}, batched=False, backend="vllm"))
    assert vllm.supports("images")
    sampling = Sampling(max_new_tokens=4, greedy=True, images=[b"png-bytes", b"jpeg-bytes"])
    assert vllm.tensors("Hi", sampling)["image"].tolist() == [base64.b64encode(b"png-bytes"),
                                                             base64.b64encode(b"jpeg-bytes")]
    assert "image" not in vllm.tensors("Hi", Sampling(max_new_tokens=4, greedy=True))
    del declared["image"]
    vllm.configure(triton_config(declared, {"text_output": "STRING"}, batched=False, backend="vllm"))
    assert not vllm.supports("images")

