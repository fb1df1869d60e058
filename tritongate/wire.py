"""What the edge and the services both know besides the protos: gRPC message size, the metadata keys
that travel beside every RPC, and the request limits both sides must agree on.

Only constants live here, so that importing it costs nothing and pulls in neither side.
"""

from __future__ import annotations

# gRPC's default limit is 4 MiB; a large embedding batch needs more. Both ends of every channel set it.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

# Metadata keys. The request id is the HTTP `X-Request-ID` at the edge and this key on every RPC (the
# only carrier); a service reads it in one place (services/common/metrics.py) and sends it on to Triton.
REQUEST_ID_KEY = "x-request-id"
# Trailing metadata of a failed RPC: the OpenAI `param` it names and the OpenAI error `code`.
PARAM_KEY = "tg-param"
CODE_KEY = "tg-code"
# The CODE_KEY of a request refused because the service is at its `max_in_flight`.
OVERLOADED = "overloaded"

# `n`: OpenAI's bound, checked by the edge; also the ceiling of a model's own `max_n` in the model
# configuration, which the llm service checks (default DEFAULT_MAX_N).
MAX_N = 128
DEFAULT_MAX_N = 16

# `stop`: strings per request. OpenAI allows 4, but editors' autocomplete (e.g. Continue) sends 9 to 14 to
# any other host; stop strings are matched on the text, so more cost little.
MAX_STOPS = 16
