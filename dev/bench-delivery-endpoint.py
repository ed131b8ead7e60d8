#!/usr/bin/env python3
"""A webhook endpoint for dev/bench-delivery.sh: answers every POST `204`
after DELAY_MS (the downstream's own time), keeps HTTP/1.1 connections
alive, and logs each request's arrival as `path<TAB>order_id<TAB>request_id`
to LOG, in arrival order, for the per-key order check.

    bench-delivery-endpoint.py DELAY_MS LOG      (prints the port, then serves)
"""
import asyncio, json, sys

DELAY = int(sys.argv[1]) / 1000
LOG = open(sys.argv[2], "w", buffering=1)  # line-buffered: read while it serves
in_flight = most = 0


async def serve(reader, writer):
    global in_flight, most
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = 0
            for line in lines[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            body = json.loads(await reader.readexactly(length)) if length else {}
            data = body.get("data") or {}
            # Logged as it arrives: the order the downstream sees.
            LOG.write(f"{path}\t{data.get('order_id')}\t{body.get('request_id')}\n")
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(DELAY)
            in_flight -= 1
            writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
