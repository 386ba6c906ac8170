"""Churn benchmark: fragmentation refusals under seeded arrivals and departures.

One map of 8 GPUs of 1.0 share, quantum 0.1, fractional EVENLY.  A seeded sequence of
``--events`` arrivals (3,000 by default) is drawn once, independently of any outcome:
each arrival asks a share on the grid, uniform in 0.1 .. ``max`` (1.0 and 2.0, one
workload each), and holds it for an exponentially distributed number of arrivals whose
mean puts the offered load at ``--load`` (90 %) of the map's 8.0 share.  Before each
arrival the allocations whose time is up are freed; a refused request is dropped.

Both allocators see the same sequence, with the anti-fragmentation guard on
(``allow_resource_fragmentation=False``) and off.  Printed per run:

* **fragmentation refusals** — refused although the total free share covered the
  request (the placement was refused, not the amount);
* **insufficient** — refused because the total free share was below the request;
* **share in use** — the mean allocated share over all arrivals, as a fraction of 8.0.

Backend.AI's allocator runs in its own interpreter (``--bai-python``, one that imports
``ai.backend.agent.alloc_map``; see ``bench/alloc_bench.py``).  Several seeds are run
(``--seeds``) and summed, since one seed's count moves by a few tens either way.

Run: ``.venv/bin/python bench/churn_bench.py [--bai-python PATH] [--seeds 1,2,3]``.
A script that prints figures, not a timed test.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import subprocess
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

N_GPUS = 8
QUANTUM = "0.1"
SLOT = "cuda.shares"


# -- the workload: plain Python, shipped verbatim to the Backend.AI interpreter ------------------
def make_events(
    seed: int, n_events: int, max_tenths: int, load: float, n_gpus: int
) -> list[tuple[int, int]]:
    """(request in tenths of a share, lifetime in arrivals) per arrival."""
    rng = random.Random(seed * 7919 + max_tenths)
    mean_tenths = (1 + max_tenths) / 2
    mean_life = load * n_gpus * 10 / mean_tenths
    return [
        (rng.randint(1, max_tenths), max(1, round(rng.expovariate(1 / mean_life))))
        for _ in range(n_events)
    ]


def churn(alloc_map: Any, events: Any, allow: bool, errors: Any) -> dict[str, Any]:
    """Run ``events`` on ``alloc_map``; the counts, the share in use and the decisions."""
    from decimal import Decimal as D

    slot = "cuda.shares"
    tenth = D("0.1")
    capacity = sum((info.amount for info in alloc_map.device_slots.values()), D(0))
    live: dict[int, list[Any]] = {}
    used = D(0)
    in_use_sum = D(0)
    fragmented = insufficient = placed = 0
    decisions = []
    for step, (tenths, life) in enumerate(events):
        for got in live.pop(step, []):
            alloc_map.free(got)
            used -= sum(got[slot].values(), D(0))
        request = tenth * tenths
        try:
            got = alloc_map.allocate({slot: request}, allow_resource_fragmentation=allow)
        except errors:
            if capacity - used >= request:
                fragmented += 1
                decisions.append("F")
            else:
                insufficient += 1
                decisions.append("I")
        else:
            placed += 1
            used += sum(got[slot].values(), D(0))
            live.setdefault(step + life, []).append(got)
            decisions.append(",".join(str(v) for v in got[slot].values() if v))
        in_use_sum += used
    return {
        "fragmented": fragmented,
        "insufficient": insufficient,
        "placed": placed,
        "in_use": str(in_use_sum / len(events) / capacity),
        "decisions": decisions,
    }


# -- accelshare --------------------------------------------------------------------------------
def run_ours(job: dict[str, Any]) -> dict[str, Any]:
    from accelshare.alloc import DeviceSlotInfo, FractionAllocMap, ResourceError
    from accelshare.common import SlotTypes

    devices = {f"GPU{i}": DeviceSlotInfo(SlotTypes.COUNT, SLOT, Decimal(1)) for i in range(N_GPUS)}
    alloc_map = FractionAllocMap(devices, quantum_size=Decimal(QUANTUM))
    events = make_events(job["seed"], job["events"], job["max"], job["load"], N_GPUS)
    return churn(alloc_map, events, job["allow"], ResourceError)


# -- Backend.AI, in its own interpreter -----------------------------------------------------------
BAI_ADAPTER = """
import json, sys
from decimal import Decimal
from ai.backend.agent.alloc_map import AllocationStrategy, DeviceSlotInfo, FractionAllocMap
try:
    from ai.backend.agent.errors import ResourceError
except ImportError:  # older releases
    from ai.backend.agent.exception import ResourceError
from ai.backend.common.types import SlotTypes

job = json.load(sys.stdin)
slots = {f"GPU{i}": DeviceSlotInfo(SlotTypes.COUNT, "cuda.shares", Decimal(1))
         for i in range(job["n"])}
m = FractionAllocMap(device_slots=slots, allocation_strategy=AllocationStrategy.EVENLY,
                     quantum_size=Decimal(job["quantum"]))
events = make_events(job["seed"], job["events"], job["max"], job["load"], job["n"])
json.dump(churn(m, events, job["allow"], ResourceError), sys.stdout)
"""


def run_bai(python: str, job: dict[str, Any]) -> dict[str, Any]:
    source = "\n".join([inspect.getsource(f) for f in (make_events, churn)] + [BAI_ADAPTER])
    header = "from __future__ import annotations\nfrom typing import Any\nimport random\n"
    completed = subprocess.run(
        [python, "-c", header + source],
        input=json.dumps({**job, "n": N_GPUS, "quantum": QUANTUM}),
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(completed.stdout)
    return result


def bai_available(python: str | None) -> str:
    """Empty when usable, else why not."""
    if not python:
        return "no --bai-python given (or ACCELSHARE_BAI_PYTHON)"
    probe = subprocess.run(
        [python, "-c", "import ai.backend.agent.alloc_map"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode:
        return f"{python} cannot import ai.backend.agent.alloc_map"
    return ""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--max", default="1.0,2.0", help="largest request of each workload")
    parser.add_argument("--bai-python", default=os.environ.get("ACCELSHARE_BAI_PYTHON"))
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    why_not = bai_available(args.bai_python)
    if why_not:
        print(f"note: Backend.AI comparison skipped: {why_not}")
    print(
        f"{N_GPUS} GPUs of 1.0 share, quantum {QUANTUM}, EVENLY, {args.events:,} arrivals,"
        f" offered load {args.load:.0%}, seeds {args.seeds} (counts summed)"
    )
    header = f"{'requests':<12} {'guard':<5} {'allocator':<11} {'frag. refusals':>15}"
    header += f" {'insufficient':>13} {'placed':>8} {'share in use':>13}"
    print(header)
    print("-" * len(header))
    for largest in args.max.split(","):
        max_tenths = int(Decimal(largest) / Decimal(QUANTUM))
        for allow in (False, True):
            rows: dict[str, list[dict[str, Any]]] = {"accelshare": [], "Backend.AI": []}
            for seed in seeds:
                job = {
                    "seed": seed,
                    "events": args.events,
                    "max": max_tenths,
                    "load": args.load,
                    "allow": allow,
                }
                rows["accelshare"].append(run_ours(job))
                if not why_not:
                    rows["Backend.AI"].append(run_bai(args.bai_python, job))
            for name, results in rows.items():
                if not results:
                    continue
                in_use = sum(Decimal(r["in_use"]) for r in results) / len(results)
                print(
                    f"0.1 - {largest:<6} {'on' if not allow else 'off':<5} {name:<11}"
                    f" {sum(r['fragmented'] for r in results):>15,}"
                    f" {sum(r['insufficient'] for r in results):>13,}"
                    f" {sum(r['placed'] for r in results):>8,} {float(in_use):>12.1%}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
