"""Images for the demo vLLM model. Each file of vllm_backend's `image` input (base64) is decoded as vLLM
decodes it (PIL, converted to RGB) and described by a caption computed from its pixels, its size and
dominant colour ("[image: 64x32, mostly red]"), which takes the place of its `<image>` in the prompt. The
demo LLM cannot see, but its answer shows that the image reached it."""

from __future__ import annotations

import base64
import binascii
import io
from collections import Counter

PLACEHOLDER = "<image>"  # where the chat template puts an image (deploy/templates/smollm2-images.jinja)
_SAMPLE = 32  # the colours are counted on a copy this many pixels wide and high at most
_COLOURS = {
    "black": (0, 0, 0), "white": (255, 255, 255), "gray": (128, 128, 128), "red": (220, 30, 30),
    "green": (30, 160, 50), "blue": (30, 70, 220), "yellow": (240, 220, 40), "orange": (245, 140, 20),
    "purple": (130, 50, 170), "pink": (245, 150, 190), "brown": (120, 75, 35), "cyan": (40, 200, 220),
}


class ImageError(ValueError):
    """An image file that cannot be read; the message says why."""


def caption(data: str | bytes) -> str:
    """The caption of one base64 image file."""
    from PIL import Image, UnidentifiedImageError  # imported when an image comes: most requests have none

    try:
        raw = base64.b64decode(data, validate=True)
        with Image.open(io.BytesIO(raw)) as image:
            rgb = image.convert("RGB")
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"an image is not valid base64: {exc}") from None
    except UnidentifiedImageError:
        raise ImageError("an image cannot be decoded: it is no PNG, JPEG, GIF or WebP file PIL can read") from None
    except OSError as exc:  # e.g. a truncated file
        raise ImageError(f"an image cannot be decoded: {exc}") from None
    width, height = rgb.size
    rgb.thumbnail((_SAMPLE, _SAMPLE))
    pixels = rgb.tobytes()  # R, G, B of each pixel in turn
    counts = Counter(_nearest((pixels[i], pixels[i + 1], pixels[i + 2])) for i in range(0, len(pixels), 3))
    colour = min(counts, key=lambda name: (-counts[name], name))  # ties: the first name, alphabetically
    return f"[image: {width}x{height}, mostly {colour}]"


def _nearest(pixel: tuple[int, int, int]) -> str:
    return min(_COLOURS, key=lambda name: sum((a - b) ** 2 for a, b in zip(pixel, _COLOURS[name], strict=True)))


def with_captions(prompt: str, images: list[str | bytes]) -> str:
    """The prompt with each `<image>` replaced by the caption of the next image, in order; images beyond the
    placeholders (a chat template that does not place images) go before the prompt."""
    captions = [caption(image) for image in images]
    parts = prompt.split(PLACEHOLDER)
    placed = min(len(parts) - 1, len(captions))
    text = parts[0] + "".join(captions[i] + parts[i + 1] if i < placed else PLACEHOLDER + parts[i + 1]
                              for i in range(len(parts) - 1))
    return "".join(captions[placed:]) + text
