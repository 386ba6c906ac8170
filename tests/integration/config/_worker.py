"""A separate OS process using the store, for the cross-process tests.

    python _worker.py lock NAME LOGFILE ROUNDS GOFILE
        # take the lock ROUNDS times, logging enter/exit; start when GOFILE exists
    python _worker.py write PREFIX COUNT         # put COUNT keys, one transaction each

The store is selected by the environment (ACCELSHARE_ETCD_ADDR / ACCELSHARE_CONFIG_STORE,
ACCELSHARE_CONFIG_NAMESPACE), as for a daemon.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from accelshare.config import open_config_store


async def lock(name: str, log: Path, rounds: int, go: Path) -> None:
    async with await open_config_store() as store:
        # Start together, so that the processes really contend for the lock.
        Path(f"{go}.ready.{os.getpid()}").touch()
        while not go.exists():
            await asyncio.sleep(0.01)
        for _ in range(rounds):
            async with store.lock(name, timeout_s=30):
                with log.open("a") as f:
                    f.write(f"enter {os.getpid()}\n")
                await asyncio.sleep(0.05)  # hold it long enough for the other to contend
                with log.open("a") as f:
                    f.write(f"exit {os.getpid()}\n")


async def write(prefix: str, count: int) -> None:
    async with await open_config_store() as store:
        for i in range(count):
            await store.put_prefix(prefix, {f"{i:03d}": str(os.getpid())})


def main() -> None:
    mode, *args = sys.argv[1:]
    if mode == "lock":
        asyncio.run(lock(args[0], Path(args[1]), int(args[2]), Path(args[3])))
    elif mode == "write":
        asyncio.run(write(args[0], int(args[1])))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
