"""Request bodies read within a limit, and JSON bodies parsed within a depth.

    body = await read_body(request, limit=1 << 20)     # RequestRefused(413) past 1 MiB
    document = load_json(body, max_depth=3)           # RequestRefused(400 / 422)

The answers follow one rule: 400 for a request that is malformed (a Content-Length that
is no number of bytes, a body that is not JSON, a client gone before its body was
complete), 413 for one that is too large (declared or counted as the body streams in),
422 for well-formed JSON the service cannot take (nesting deeper than allowed, a number
with more digits than any value it takes). The limit is applied before the body is read:
a declared length past it is refused at once, and the bytes are counted as they arrive,
so a large body is never held whole. Starlette is imported only when a body is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ContractError, HrxError

if TYPE_CHECKING:
    from starlette.requests import Request

MAX_DIGITS = 1000
"""Digits a JSON integer may have: more is no value any service takes, and converting it
costs time that grows with the square of its length."""

_LENGTH = re.compile(r"[0-9]+")

_BRACKET_STEP = np.zeros(256, np.int8)
_BRACKET_STEP[[ord("["), ord("{")]] = 1
_BRACKET_STEP[[ord("]"), ord("}")]] = -1


class RequestRefused(HrxError):
    """A request a service will not take: `status` is the HTTP status to answer, `detail`
    what to tell the client."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def media_type(headers: Mapping[str, str], default: str = "") -> str:
    """The Content-Type of `headers` without its parameters, in lower case."""
    return headers.get("content-type", default).split(";")[0].strip().lower()


def _shown(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[: limit - 3]) + "..."


def declared_length(values: list[str], limit: int | None = None) -> int | None:
    """The body length the Content-Length values declare (None without one).

    RequestRefused(400) unless every value is the same whole number of bytes; with a
    `limit`, RequestRefused(413) for a length past it, even one written as a float
    ("1e20"): it is refused for its size whatever its notation."""
    if not values:
        return None
    texts = {part.strip() for value in values for part in value.split(",")}
    if len(texts) != 1:
        shown = ", ".join(_shown(v) for v in values)
        raise RequestRefused(400, f"Content-Length is given as different values: {shown}")
    (text,) = texts
    if not _LENGTH.fullmatch(text):
        if limit is not None and _beyond(text, limit):
            raise RequestRefused(
                413, f"the body is too large: {_shown(text)} bytes, at most {limit}"
            )
        raise RequestRefused(
            400, f"Content-Length must be a whole number of bytes, got {_shown(text)}"
        )
    digits = text.lstrip("0") or "0"
    # Past 20 digits it is beyond any limit (2**64 has 20); int() of it would be slow.
    length = int(digits) if len(digits) <= 20 else 2**64
    if limit is not None and length > limit:
        raise RequestRefused(413, f"the body is too large: {length} bytes, at most {limit}")
    return length


def _beyond(text: str, limit: int) -> bool:
    try:
        return float(text[:64]) > limit  # NaN compares false: malformed, not large
    except ValueError:
        return False


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, at most `limit` bytes; RequestRefused (413, or 400) otherwise."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ContractError(f"limit must be a number of bytes >= 0, got {limit!r}")
    from starlette.requests import ClientDisconnect

    declared_length(request.headers.getlist("content-length"), limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestRefused(413, f"the body is too large: over {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # Nobody is left to read the answer; the 400 only ends the request quietly.
        raise RequestRefused(400, "the client disconnected before the body was complete") from None
    return b"".join(chunks)


def json_depth(body: bytes) -> int:
    """How deep arrays and objects nest in a JSON text, brackets inside strings not counted.

    In numpy, without parsing: the parser recurses once per level, and this costs about as
    much for a hostile body as parsing a valid one of the same size.
    """
    text = np.frombuffer(body, np.uint8)
    delimiters = text == ord('"')
    if b"\\" in body:
        # A quote is part of a string, not its end, when an odd run of backslashes comes
        # right before it.
        positions = np.arange(text.size, dtype=np.int32)
        last_plain = np.maximum.accumulate(np.where(text == ord("\\"), -1, positions))
        quotes = np.flatnonzero(delimiters)
        run = quotes - 1 - last_plain[np.maximum(quotes - 1, 0)]
        delimiters[quotes[(quotes > 0) & (run % 2 == 1)]] = False
    # After an odd number of delimiters, a byte is inside a string.
    inside = np.bitwise_xor.accumulate(delimiters.view(np.uint8)).view(np.bool_)
    steps = _BRACKET_STEP[text]
    steps = steps[(steps != 0) & ~inside].astype(np.int32)
    return int(np.cumsum(steps, out=steps).max(initial=0))


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise RequestRefused(
            422, f"the JSON body holds an integer of {len(text.lstrip('-'))} digits"
        )
    return int(text)


def load_json(body: bytes, max_depth: int, expected: str = "") -> Any:
    """`body` parsed as UTF-8 JSON nesting at most `max_depth` arrays and objects deep.

    RequestRefused: 422 when it nests deeper or holds an integer of more than MAX_DIGITS
    digits (`expected`, when given, says what the service takes), 400 when it is not
    JSON. NaN and Infinity are taken as Python's json takes them."""
    if body.count(b"[") + body.count(b"{") > max_depth:
        depth = json_depth(body)  # only a body with enough brackets can nest too deep
        if depth > max_depth:
            hint = f" ({expected})" if expected else ""
            raise RequestRefused(
                422,
                f"JSON body nests arrays/objects {depth} deep; at most {max_depth} allowed{hint}",
            )
    try:
        return json.loads(body.decode("utf-8"), parse_int=_integer)
    except UnicodeDecodeError as exc:
        raise RequestRefused(
            400, f"body is not valid JSON: not UTF-8 text ({exc.reason})"
        ) from None
    except json.JSONDecodeError as exc:
        raise RequestRefused(400, f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestRefused(422, "JSON body nests too deep") from None


__all__ = [
    "MAX_DIGITS",
    "RequestRefused",
    "declared_length",
    "json_depth",
    "load_json",
    "media_type",
    "read_body",
]


def raw_pixels(
    body: bytes, shape: str | None, dtype: str | None, max_side: int, max_batch: int
) -> np.ndarray[Any, Any]:
    """Raw u8 RGB pixels, channels last, as u8 [n, h, w, 3] over `body` (no copy).

    `shape` is the request's ``X-Image-Shape`` header, ``height,width,3`` for one picture
    or ``n,height,width,3`` for n pictures of one size; `dtype` its ``X-Image-Dtype``,
    ``u8`` when given. `RequestRefused(422)` when a header is missing or malformed, the
    shape is not RGB, has no pixel, holds more than `max_batch` pictures or does not match
    the body's length; `RequestRefused(413)` for a side longer than `max_side`.
    """
    if dtype is not None and dtype.strip().lower() not in ("u8", "uint8"):
        raise RequestRefused(
            422, f"pixels must be u8 (one byte per channel), got X-Image-Dtype {_shown(dtype)!r}"
        )
    usage = "X-Image-Shape must be 'height,width,3' or 'n,height,width,3'"
    if shape is None:
        raise RequestRefused(422, f"{usage}: the header is missing")
    try:
        dims = tuple(int(v) for v in shape.split(","))
    except ValueError:
        raise RequestRefused(422, f"{usage}, got {_shown(shape)!r}") from None
    if len(dims) == 3:
        dims = (1, *dims)
    if len(dims) != 4 or dims[3] != 3:
        raise RequestRefused(422, f"{usage} (RGB, channels last), got {_shown(shape)!r}")
    n, h, w, c = dims
    if min(dims) < 1:
        raise RequestRefused(422, f"a picture needs at least one pixel, got shape {list(dims)}")
    if n > max_batch:
        raise RequestRefused(422, f"at most {max_batch} pictures per request, got {n}")
    if h > max_side or w > max_side:
        raise RequestRefused(413, f"pictures are at most {max_side}x{max_side} pixels, got {h}x{w}")
    if len(body) != n * h * w * c:
        raise RequestRefused(
            422, f"{len(body)} bytes do not hold {n}x{h}x{w}x{c} u8 pixels ({n * h * w * c} bytes)"
        )
    return np.frombuffer(body, np.uint8).reshape(n, h, w, c)
