"""Kernel start benchmark: the CPU one process-runtime kernel start costs, and where.

A ``ProcessRuntime`` as the agent runs it (fork server, cgroups where writable) starts
``--kernels`` idle ``shell`` kernels one after another, then destroys them; rounds
alternate sandboxed (bubblewrap, the default where the host can) and unsandboxed, so the
two see the same machine.  Per kernel start it prints the CPU of this process (the
agent's part: the launch record, the scratch dir and its files, the cgroups, the hand-off
to the fork server and the status read) and, when the bench runs in a cgroup of its own
(cgroup v1 ``cpuacct`` or v2), of that cgroup: this process plus the kernel's supervisor
(the exec helper's ``supervise``, spawned by the fork server, or without the helper a
forked Python process), the kernel's process before its exec, bwrap, the user change
(the exec helper's ``drop``, or ``setpriv``) and the kernel's own command (``sleep``).
The exec helper is built as the agent builds it (``--exec-helper off``: the Python way).
Outside such a cgroup only the agent's part is printed (the others are reparented to
init: no rusage of this process counts them).  The scratch dirs go under ``TMPDIR``: the
agent's part is mostly their new folders and files, so compare runs on the same disk
(the same ``TMPDIR``), alternating.

Run as root for the sandbox:
``mkdir /sys/fs/cgroup/cpuacct/ksb && echo $$ > /sys/fs/cgroup/cpuacct/ksb/cgroup.procs``,
then ``.venv/bin/python bench/kernel_start_bench.py [--kernels 100] [--rounds 3]``.
A script that prints figures, not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from accelshare.agent.runtime import ProcessRuntime, ProcessRuntimeConfig
from accelshare.agent.runtime.base import KernelSpec
from accelshare.agent.runtime.exec_helper import prepare_exec_helper
from accelshare.agent.runtime.sandbox import SandboxConfig, probe, write_syscall_filter


def own_cgroup_usage() -> Callable[[], float] | None:
    """CPU seconds of this process's own cgroup (None at a hierarchy's root)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if path == "/":
            continue
        if "cpuacct" in controllers.split(","):
            usage = Path("/sys/fs/cgroup/cpuacct") / path.lstrip("/") / "cpuacct.usage"
            if usage.exists():
                return lambda: int(usage.read_text()) / 1e9
        if controllers == "":
            stat = Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.stat"
            if stat.exists():
                return lambda: int(stat.read_text().split()[1]) / 1e6  # usage_usec
    return None


async def one_round(
    root: Path,
    sandbox: SandboxConfig | None,
    kernels: int,
    usage: Callable[[], float] | None,
    exec_helper: Path | None,
) -> dict[str, float]:
    runtime = ProcessRuntime(
        ProcessRuntimeConfig(
            scratch_root=root, sandbox=sandbox, fork_server=True, exec_helper=exec_helper
        )
    )
    # warm-up: the fork server, the first kernel's imports and caches
    warm = await runtime.create_kernel(KernelSpec(f"w-{uuid.uuid4().hex[:10]}", "shell", ""))
    await runtime.destroy_kernel(warm.kernel_id, grace_s=0)
    await runtime.cleanup_kernel(warm.kernel_id)
    ids = [f"k-{uuid.uuid4().hex[:10]}" for _ in range(kernels)]
    own0, all0 = time.process_time(), usage() if usage else 0.0
    for kernel_id in ids:
        info = await runtime.create_kernel(KernelSpec(kernel_id, "shell", ""))
        if not info.is_running:
            raise SystemExit(f"kernel {kernel_id} did not start: {info}")
    own1, all1 = time.process_time(), usage() if usage else 0.0
    for kernel_id in ids:
        await runtime.destroy_kernel(kernel_id, grace_s=1)
    await asyncio.sleep(0.5)  # the supervisors' last writes
    own2, all2 = time.process_time(), usage() if usage else 0.0
    for kernel_id in ids:
        await runtime.cleanup_kernel(kernel_id)
    await runtime.close()
    result = {"agent": (own1 - own0) / kernels, "destroy agent": (own2 - own1) / kernels}
    if usage:
        result["all"] = (all1 - all0) / kernels
        result["destroy all"] = (all2 - all1) / kernels
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", type=int, default=100, help="kernels per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind")
    parser.add_argument(
        "--exec-helper",
        choices=("auto", "off"),
        default="auto",
        help="start kernels with the exec helper where it builds (auto), or the Python way",
    )
    args = parser.parse_args()
    usage = own_cgroup_usage()
    if usage is None:
        print("not in a cgroup of its own: only the agent's part is measured", file=sys.stderr)
    results: dict[str, list[dict[str, float]]] = {"sandboxed": [], "unsandboxed": []}
    with tempfile.TemporaryDirectory(prefix="accelshare-ksb-") as tmp:
        base = Path(tmp)
        syscall_filter = base / "seccomp.bpf"
        write_syscall_filter(syscall_filter)
        helper = prepare_exec_helper(base).path if args.exec_helper == "auto" else None
        print(f"kernel exec: {'exec helper ' + str(helper) if helper else 'python fork'}")
        sandbox = SandboxConfig(syscall_filter=syscall_filter, exec_helper=helper)
        why_not = probe(sandbox)
        if why_not is not None:
            print(f"no sandbox here ({why_not}): unsandboxed rounds only", file=sys.stderr)
        for n in range(args.rounds):
            kinds = ["sandboxed", "unsandboxed"] if n % 2 == 0 else ["unsandboxed", "sandboxed"]
            for kind in kinds:
                if kind == "sandboxed" and why_not is not None:
                    continue
                root = base / f"{kind}-{n}"
                config = sandbox if kind == "sandboxed" else None
                results[kind].append(
                    asyncio.run(one_round(root, config, args.kernels, usage, helper))
                )
    print(f"CPU per kernel, median of {args.rounds} rounds of {args.kernels} kernels (ms):")
    for kind, rounds in results.items():
        if not rounds:
            continue
        parts = {k: statistics.median(r[k] for r in rounds) * 1000 for k in rounds[0]}
        line = f"  {kind:<11}  start: agent {parts['agent']:.2f}"
        if "all" in parts:
            line += f", all {parts['all']:.2f} (the rest {parts['all'] - parts['agent']:.2f})"
        line += f"; destroy: agent {parts['destroy agent']:.2f}"
        if "destroy all" in parts:
            line += f", all {parts['destroy all']:.2f}"
        print(line)


if __name__ == "__main__":
    main()
