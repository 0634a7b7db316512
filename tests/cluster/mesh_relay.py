"""A stand-in for Swarm's routing mesh, where the kernel has no IPVS (as on the test machine).

Run in a container on the gateway's front network: each connection goes to
one of the addresses ``tasks.<service>`` resolves to, in turn, skipping one
that refuses, as the mesh spreads connections over a service's live tasks.
Usage: ``python3 mesh_relay.py tasks.<stack>_gateway PORT`` (listens on 8765).
"""

import asyncio
import itertools
import socket
import sys

NAME, PORT = sys.argv[1], int(sys.argv[2])
TURN = itertools.count()


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def serve(reader, writer):
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(NAME, PORT, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except OSError:
        writer.close()
        return
    addresses = sorted({info[4][0] for info in found})
    first = next(TURN)
    for k in range(len(addresses)):
        address = addresses[(first + k) % len(addresses)]
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(address, PORT), 1)
            break
        except (TimeoutError, OSError):
            continue
    else:
        writer.close()
        return
    await asyncio.gather(pipe(reader, upstream[1]), pipe(upstream[0], writer))


async def main():
    server = await asyncio.start_server(serve, "0.0.0.0", 8765)
    async with server:
        await server.serve_forever()


asyncio.run(main())
