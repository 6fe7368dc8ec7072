"""Runs a FaultProxy in a process of its own, so its CPU does not compete with what is measured.

python bench/proxy_process.py HOST PORT BYTES_PER_S   → prints "listening PORT", runs until killed
"""

from __future__ import annotations

import asyncio
import sys

from truba.local.proxy import FaultProxy


async def main(host: str, port: int, bytes_per_s: float) -> None:
    proxy = FaultProxy(host, port)
    await proxy.start()
    proxy.bandwidth(bytes_per_s)
    print(f"listening {proxy.port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
