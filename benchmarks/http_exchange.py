"""One HTTP/1.1 request and its answer over a keep-alive connection, for the load clients.

The load benchmarks write requests by hand and read answers by hand, so a client costs
the server nothing beyond the protocol and costs the client process little: a status
line, headers up to the blank line, then exactly Content-Length bytes.
"""

from __future__ import annotations

import asyncio


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[bytes, bytes]:
    """Send `request` (a whole HTTP/1.1 request) and read its answer: (status line, body)."""
    writer.write(request)
    status = await reader.readline()
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)
