"""How a conversation is kept in the state store (an interactive session's, a stored Response's): a head
in JSON (what the endpoint keeps beside it), a newline, then the messages as the generation takes them
(an `llm.v1.Chat`'s bytes), so that reading them back needs no validation. The head is compact JSON,
which holds no newline: the first newline ends it. An entry in the older, all-JSON form (messages
included, no newline at all) is told apart by `decode` (None).
"""

from __future__ import annotations

from collections.abc import Iterable

from tritongate.llm.v1 import llm_pb2


def encode(head: bytes, messages: Iterable[llm_pb2.ChatMessage]) -> bytes:
    return head + b"\n" + llm_pb2.Chat(messages=messages).SerializeToString()


def decode(value: bytes) -> tuple[bytes, list[llm_pb2.ChatMessage]] | None:
    """The head and the messages; None for an entry in the older, all-JSON form."""
    head, newline, chat = value.partition(b"\n")
    if not newline:
        return None
    return head, list(llm_pb2.Chat.FromString(chat).messages)
