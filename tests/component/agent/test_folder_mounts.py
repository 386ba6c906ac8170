"""Storage folders mounted into process-runtime kernels (``KernelSpec.folder_mounts``).

Real sandboxed kernels (skipped where this host cannot sandbox): a read-write folder is
written from inside and the file shows on the host as the kernel's user's; a read-only
folder cannot be written (EROFS); an exec in the kernel sees the same folders; bad host
folders and kernel paths fail the start with a reason naming the mount.  An unsandboxed
kernel gets read-write folders under /home/work as symlinks and refuses the rest.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from accelshare.agent.runtime import KernelSpec, KernelStartFailed, ProcessRuntime
from accelshare.agent.runtime.folder_mounts import FolderMount
from accelshare.agent.runtime.sandbox import SandboxConfig
from accelshare_testkit.kernel_exec import run_in_kernel

RuntimeFactory = Callable[..., ProcessRuntime]
KERNEL_UID, KERNEL_GID = SandboxConfig().effective_ids()

SCRIPT = r"""
cd "$HOME"
echo "made-inside" > data/from-kernel.txt && echo rw_write=ok || echo rw_write=fail
echo rw_owner=$(stat -c %u data/from-host.txt)
echo ro_read=$(cat ro/readme.txt)
echo ro_owner=$(stat -c %u ro/readme.txt)
( echo x > ro/new.txt ) 2>"$HOME/err" && echo ro_write=ok || echo ro_write=fail
echo ro_error=$(grep -o -i -E "read-only file system|permission denied" "$HOME/err" | head -1)
( rm ro/readme.txt ) 2>/dev/null && echo ro_rm=ok || echo ro_rm=fail
echo abs_read=$(cat /datasets/shared/readme.txt)
echo ready
exec sleep 3600
"""


def _fields(log: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in log.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.replace("_", "").isalnum():
            found[key] = value.strip()
    return found


def _spec(command: tuple[str, ...] | None, folders: tuple[FolderMount, ...]) -> KernelSpec:
    return KernelSpec(
        kernel_id=f"mnt-{uuid.uuid4().hex[:10]}",
        image="shell",
        resource_txt="SLOTS={}\n",
        command=command,
        folder_mounts=folders,
    )


@pytest.fixture
async def sandboxed(
    make_runtime: RuntimeFactory, sandbox_support: str | None
) -> AsyncIterator[ProcessRuntime]:
    if sandbox_support is not None:
        pytest.skip(sandbox_support)
    runtime = make_runtime(sandbox=SandboxConfig())
    yield runtime
    await runtime.close()


def _folders(tmp_path: Path) -> tuple[Path, Path, Path]:
    rw, ro, shared = tmp_path / "vol" / "rw", tmp_path / "vol" / "ro", tmp_path / "vol" / "sh"
    for folder in (rw, ro, shared):
        folder.mkdir(parents=True)
    (rw / "from-host.txt").write_text("host\n")
    (ro / "readme.txt").write_text("read-me\n")
    (shared / "readme.txt").write_text("shared-data\n")
    for folder in (rw, ro, shared):
        folder.chmod(0o755)
    return rw, ro, shared


async def test_rw_and_ro_folders_inside_a_sandboxed_kernel(
    sandboxed: ProcessRuntime, tmp_path: Path, eventually: Any
) -> None:
    rw, ro, shared = _folders(tmp_path)
    folders = (
        FolderMount("data", str(rw), "/home/work/data"),
        FolderMount("ro", str(ro), "/home/work/ro", read_only=True),
        FolderMount("shared", str(shared), "/datasets/shared", read_only=True),
    )
    kernel = _spec((SCRIPT,), folders)  # the "shell" environment runs a script
    await sandboxed.create_kernel(kernel)
    log_file = sandboxed.scratch_root / kernel.kernel_id / "logs" / "kernel.log"
    await eventually(lambda: "ready" in log_file.read_text(), what="the script's end")
    found = _fields(log_file.read_text())
    assert found["rw_write"] == "ok"
    assert (rw / "from-kernel.txt").read_text() == "made-inside\n"
    assert (rw / "from-kernel.txt").stat().st_uid == KERNEL_UID
    # the host's files are the kernel's user's inside (a root agent gives them over)
    assert found["rw_owner"] == str(KERNEL_UID)
    assert found["ro_owner"] == str(KERNEL_UID)
    assert found["ro_read"] == "read-me"
    assert found["ro_write"] == "fail"
    # the folder is the kernel user's (mode 0755): only the read-only mount stops the write
    assert found["ro_error"].lower() == "read-only file system"

    assert found["ro_rm"] == "fail"
    assert (ro / "readme.txt").exists()
    assert not (ro / "new.txt").exists()
    assert found["abs_read"] == "shared-data"

    # an exec in the kernel (the execute API's `run`, terminals) joins the same mounts
    result = await run_in_kernel(
        sandboxed,
        kernel.kernel_id,
        [
            "sh",
            "-c",
            'cat "$HOME/data/from-kernel.txt"; echo y > "$HOME/ro/x" 2>/dev/null'
            " && echo exec_ro=ok || echo exec_ro=fail",
        ],
    )
    assert "made-inside" in result.stdout
    assert "exec_ro=fail" in result.stdout


@pytest.mark.parametrize(
    ("make_host", "expected"),
    [
        (lambda base: base / "missing", "does not exist"),
        (lambda base: _file(base / "plain.txt"), "is not a directory"),
    ],
)
async def test_a_bad_host_folder_fails_the_start_naming_the_mount(
    sandboxed: ProcessRuntime,
    tmp_path: Path,
    make_host: Callable[[Path], Path],
    expected: str,
) -> None:
    host = make_host(tmp_path)
    kernel = _spec(None, (FolderMount("mydata", str(host), "/home/work/mydata"),))
    with pytest.raises(KernelStartFailed) as caught:
        await sandboxed.create_kernel(kernel)
    assert "mount 'mydata'" in str(caught.value)
    assert expected in str(caught.value)


async def test_a_kernel_path_over_the_sandboxs_own_binds_is_refused(
    sandboxed: ProcessRuntime, tmp_path: Path
) -> None:
    rw, _, _ = _folders(tmp_path)
    own = str(sandboxed.scratch_root)  # the scratch root: every kernel's folders
    kernel = _spec(None, (FolderMount("over", str(rw), own),))
    with pytest.raises(KernelStartFailed) as caught:
        await sandboxed.create_kernel(kernel)
    assert "mount 'over'" in str(caught.value)
    assert "would cover" in str(caught.value) or "lies inside" in str(caught.value)


def _file(path: Path) -> Path:
    path.write_text("not a folder\n")
    return path


async def test_an_unsandboxed_kernel_gets_rw_folders_as_links_and_refuses_ro(
    make_runtime: RuntimeFactory, tmp_path: Path, eventually: Any
) -> None:
    runtime = make_runtime(sandbox=None)
    rw, ro, _ = _folders(tmp_path)
    kernel = _spec(
        ('echo in > "$HOME/data/x.txt"; echo ready; exec sleep 3600',),
        (FolderMount("data", str(rw), "/home/work/data"),),
    )
    await runtime.create_kernel(kernel)
    log_file = runtime.scratch_root / kernel.kernel_id / "logs" / "kernel.log"
    await eventually(lambda: "ready" in log_file.read_text(), what="the write")
    assert (rw / "x.txt").read_text() == "in\n"
    refused = _spec(None, (FolderMount("ro", str(ro), "/home/work/ro", read_only=True),))
    with pytest.raises(KernelStartFailed, match="mount 'ro': a read-only mount needs the sandbox"):
        await runtime.create_kernel(refused)
    elsewhere = _spec(None, (FolderMount("abs", str(rw), "/datasets/abs"),))
    with pytest.raises(KernelStartFailed, match="mount 'abs'"):
        await runtime.create_kernel(elsewhere)
    assert os.path.isdir(rw)
