"""An asyncio caller: four requests at once on one client, then a streamed reply."""

import asyncio
import sys

from domo.asyncio import Client


async def main(endpoint: str) -> None:
    async with Client(endpoint, timeout=2.5, retries=3, concurrency=4) as client:
        words = [b"one", b"two", b"three", b"four"]
        replies = await asyncio.gather(*(client.request("upper", word) for word in words))
        print(" ".join(reply[0].decode() for reply in replies))
        async with client.stream("count", b"3") as stream:
            async for reply in stream:
                print(reply.body[0].decode(), "(final)" if reply.final else "(partial)")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"))
