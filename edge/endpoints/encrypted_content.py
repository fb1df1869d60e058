"""A reasoning item's `encrypted_content` as this server writes it (Responses' `include:
["reasoning.encrypted_content"]`): `tg1:`, then the thinking's UTF-8, compressed (zlib) and in base64url.
Clients keep it opaque and send it back with the item, so that a stateless agent (`store: false`) replays
its earlier thinking to the model. It is not secret (the item's content holds the same thinking) and needs
no key, so that any edge reads what any other wrote. What another server wrote is not read (None).
"""

from __future__ import annotations

import base64
import binascii
import zlib

PREFIX = "tg1:"
MAX_THINKING_BYTES = 4 * 1024 * 1024  # far beyond any context: a larger one is not ours


def encrypted_content(thinking: str) -> str:
    return PREFIX + base64.urlsafe_b64encode(zlib.compress(thinking.encode())).decode()


def thinking_of(content: object) -> str | None:
    """The thinking in an `encrypted_content` of ours; None for anything else."""
    if not isinstance(content, str) or not content.startswith(PREFIX):
        return None
    try:
        inflate = zlib.decompressobj()
        data = inflate.decompress(base64.urlsafe_b64decode(content[len(PREFIX):]), MAX_THINKING_BYTES)
        if inflate.unconsumed_tail or not inflate.eof:
            return None
        return data.decode()
    except (binascii.Error, ValueError, zlib.error):  # UnicodeDecodeError is a ValueError
        return None
