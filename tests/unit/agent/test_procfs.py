"""/proc parsing on a fake tree: identity checks and kernel marks."""

from __future__ import annotations

from pathlib import Path

from accelshare.agent.runtime.procfs import (
    find_marked_processes,
    is_same_process,
    read_environ,
    read_stat,
)


def stat_line(pid: int, comm: str, state: str = "S", start: int = 1234, pgid: int = 0) -> str:
    # fields 3.. after the command: state ppid pgrp session tty tpgid flags minflt cminflt
    # majflt cmajflt utime stime cutime cstime priority nice threads itrealvalue starttime
    rest = [state, "1", str(pgid or pid), "1", "0", "-1", "0"] + ["0"] * 12 + [str(start)]
    return f"{pid} ({comm}) " + " ".join(rest) + " 0 0\n"


def fake_process(
    proc: Path, pid: int, *, env: dict[str, str], cmdline: list[str], **stat: str
) -> None:
    directory = proc / str(pid)
    directory.mkdir(parents=True)
    directory.joinpath("stat").write_text(
        stat_line(pid, stat.get("comm", "sh"), stat.get("state", "S"))
    )
    directory.joinpath("environ").write_bytes(
        b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0"
    )
    directory.joinpath("cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")


def test_read_stat_handles_odd_command_names(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_text(stat_line(7, "a) b (c", start=99, pgid=5))
    stat = read_stat(7, tmp_path)
    assert stat is not None
    assert (stat.pid, stat.state, stat.pgid, stat.start_ticks) == (7, "S", 5, 99)
    assert read_stat(8, tmp_path) is None
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "stat").write_text("garbage")
    assert read_stat(9, tmp_path) is None


def test_identity_needs_start_time_liveness_and_kernel_mark(tmp_path: Path) -> None:
    fake_process(tmp_path, 10, env={"ACCELSHARE_KERNEL_ID": "k1"}, cmdline=["sleep"])
    assert is_same_process(10, 1234, kernel_id="k1", proc_root=tmp_path)
    assert is_same_process(10, None, proc_root=tmp_path)
    assert not is_same_process(10, 1235, proc_root=tmp_path)  # a recycled pid
    assert not is_same_process(10, 1234, kernel_id="k2", proc_root=tmp_path)
    assert not is_same_process(11, None, proc_root=tmp_path)
    fake_process(tmp_path, 12, env={}, cmdline=["x"], state="Z")
    assert not is_same_process(12, None, proc_root=tmp_path)  # a zombie has ended
    assert read_environ(10, tmp_path) == {"ACCELSHARE_KERNEL_ID": "k1"}
    assert read_environ(99, tmp_path) is None


def test_find_marked_processes(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    root = tmp_path / "scratch"
    mark = {
        "ACCELSHARE_KERNEL_ID": "k1",
        "ACCELSHARE_RESOURCE_TXT": f"{root}/k1/config/resource.txt",
    }
    fake_process(proc, 100, env=mark, cmdline=["sleep", "infinity"])
    fake_process(proc, 101, env=mark, cmdline=["child"])
    fake_process(
        proc,
        102,
        env={},
        cmdline=["python", "-I", "-S", "l.py", f"{root}/k2/state/launch.json", "5"],
    )
    other = {
        "ACCELSHARE_KERNEL_ID": "k3",
        "ACCELSHARE_RESOURCE_TXT": "/elsewhere/k3/config/resource.txt",
    }
    fake_process(proc, 103, env=other, cmdline=["sleep"])  # another agent's kernel
    fake_process(proc, 104, env=mark, cmdline=["dead"], state="Z")
    (proc / "self").mkdir()
    assert find_marked_processes(root, proc) == {"k1": [100, 101], "k2": [102]}
    assert find_marked_processes(root, tmp_path / "none") == {}
