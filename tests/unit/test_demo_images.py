"""The demo vLLM model's images (tritongate/demo_models/images.py): each file's caption, its size and dominant
colour, computed from its pixels, takes the place of its `<image>` in the prompt."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tritongate.demo_models.images import ImageError, caption, with_captions


def encoded(image: Image.Image, kind: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, format=kind)
    return base64.b64encode(out.getvalue())


def test_a_caption_says_the_size_and_the_colour_most_pixels_are_near() -> None:
    assert caption(encoded(Image.new("RGB", (64, 32), (250, 10, 10)))) == "[image: 64x32, mostly red]"
    picture = Image.new("RGB", (40, 10), (255, 255, 255))
    picture.paste((10, 40, 200), (0, 0, 30, 10))  # three quarters blue
    assert caption(encoded(picture)) == "[image: 40x10, mostly blue]"
    # Any mode PIL reads, as RGB (here a palette GIF and a grey-scale JPEG).
    assert caption(encoded(Image.new("P", (3, 2), 0), "GIF")) == "[image: 3x2, mostly black]"
    assert caption(encoded(Image.new("L", (5, 7), 128), "JPEG")) == "[image: 5x7, mostly gray]"


def test_captions_take_the_places_of_the_images_in_order() -> None:
    red, green = encoded(Image.new("RGB", (2, 2), (230, 20, 20))), encoded(Image.new("RGB", (4, 1), (20, 170, 40)))
    assert with_captions("A <image>\nB <image>\nC", [red, green]) == \
        "A [image: 2x2, mostly red]\nB [image: 4x1, mostly green]\nC"
    assert with_captions("no place", [red]) == "[image: 2x2, mostly red]no place"  # a template without images
    assert with_captions("<image> and <image>", [red]) == "[image: 2x2, mostly red] and <image>"
    assert with_captions("plain", []) == "plain"


@pytest.mark.parametrize(("data", "says"), [
    (b"not base64!", "not valid base64"),
    (base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16), "cannot be decoded"),
])
def test_a_file_that_is_no_image_is_refused(data: bytes, says: str) -> None:
    with pytest.raises(ImageError, match=says):
        caption(data)
