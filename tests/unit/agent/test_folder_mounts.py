"""Storage folder mounts: kernel paths, resource.txt's MOUNTS line, bwrap's and docker's
arguments (pure: no kernel started)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from accelshare.agent.launch import build_kernel_spec
from accelshare.agent.resource_txt import parse_resource_txt
from accelshare.agent.runtime.base import KernelSpec
from accelshare.agent.runtime.docker import DockerRuntimeConfig, container_config
from accelshare.agent.runtime.folder_mounts import (
    FolderMount,
    MountRefused,
    check_host_folder,
    give_to_kernel_user,
    normalize_kernel_path,
)
from accelshare.agent.runtime.sandbox import SandboxConfig, sandbox_record
from accelshare.agent.scratch import ScratchDir
from accelshare.common import SlotTypes
from accelshare.protocol import CreateKernelRequest, KernelMount


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("/home/work/data", "/home/work/data"),
        ("data", "/home/work/data"),
        ("nested/deep", "/home/work/nested/deep"),
        ("/home/work/./x/", "/home/work/x"),
        ("/datasets/imagenet", "/datasets/imagenet"),
        ("/tmp/scratch-data", "/tmp/scratch-data"),
    ],
)
def test_kernel_paths_are_made_absolute(given: str, expected: str) -> None:
    assert normalize_kernel_path("f", given) == expected


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("/home/work/../../etc", "'..'"),
        ("../x", "'..'"),
        ("/home/work/a\x00b", "NUL"),
        ("/home/work/a:b", "':'"),
        ("/home/work/a,b", "','"),
        ("/", "system folder"),
        ("/home/work", "system folder"),
        ("/usr", "system folder /usr"),
        ("/usr/local/lib", "system folder /usr"),
        ("/etc/ssl", "system folder /etc"),
        ("/proc/self", "system folder /proc"),
        ("/dev/shm", "system folder /dev"),
        ("/home/config", "system folder /home/config"),
        ("/tmp", "system folder"),
    ],
)
def test_bad_kernel_paths_are_refused_naming_the_mount(given: str, why: str) -> None:
    with pytest.raises(MountRefused) as caught:
        normalize_kernel_path("mine", given)
    assert str(caught.value).startswith("mount 'mine': ")
    assert why in str(caught.value)


def test_host_folder_checks(tmp_path: Path) -> None:
    with pytest.raises(MountRefused, match=r"mount 'a': host_path .* does not exist"):
        check_host_folder(FolderMount("a", str(tmp_path / "nope"), "/home/work/a"))
    (tmp_path / "f").write_text("x")
    with pytest.raises(MountRefused, match=r"mount 'b': host_path .* is not a directory"):
        check_host_folder(FolderMount("b", str(tmp_path / "f"), "/home/work/b"))
    with pytest.raises(MountRefused, match="is not absolute"):
        check_host_folder(FolderMount("c", "relative/dir", "/home/work/c"))
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    found = check_host_folder(FolderMount("d", str(tmp_path / "link"), "/home/work/d"))
    assert found == (tmp_path / "d").resolve()


@pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")
def test_files_of_other_users_are_given_to_the_kernel_user(tmp_path: Path) -> None:
    folder = tmp_path / "vol"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.txt").write_text("a")
    (folder / "b.txt").write_text("b")
    outside = tmp_path / "outside.txt"
    outside.write_text("o")
    (folder / "link").symlink_to(outside)
    os.chown(folder / "b.txt", 4242, 4242)
    changed = give_to_kernel_user(folder, 4242, 4242)
    assert changed == 4  # folder, sub, sub/a.txt, link; b.txt already was
    for path in (folder, folder / "sub", folder / "sub" / "a.txt", folder / "b.txt"):
        assert (path.stat().st_uid, path.stat().st_gid) == (4242, 4242)
    assert os.lstat(folder / "link").st_uid == 4242
    assert outside.stat().st_uid == 0  # a symlink's target is never followed
    assert give_to_kernel_user(folder, 4242, 4242) == 0


def _request(*mounts: KernelMount) -> CreateKernelRequest:
    return CreateKernelRequest(
        kernel_id="k1",
        session_id="s1",
        image="python",
        requested_slots={"cpu": "1"},
        mounts=list(mounts),
    )


def test_the_spec_and_resource_txt_carry_the_mounts() -> None:
    request = _request(
        KernelMount(name="data", host_path="/vol/u1/data", kernel_path="/home/work/data"),
        KernelMount(name="ds", host_path="/vol/p/ds", kernel_path="ds", read_only=True),
    )
    spec, content = build_kernel_spec(request, {}, {}, {}, {"cpu": SlotTypes.COUNT}, host_cpus=None)
    assert spec.folder_mounts == (
        FolderMount("data", "/vol/u1/data", "/home/work/data", False),
        FolderMount("ds", "/vol/p/ds", "/home/work/ds", True),
    )
    text = spec.resource_txt
    assert "MOUNTS=/vol/u1/data:/home/work/data:rw,/vol/p/ds:/home/work/ds:ro\n" in text
    parsed = parse_resource_txt(text, {"cpu": SlotTypes.COUNT})
    assert [(m.source, m.target, m.perm) for m in parsed.mounts] == [
        ("/vol/u1/data", "/home/work/data", "rw"),
        ("/vol/p/ds", "/home/work/ds", "ro"),
    ]
    assert content.mounts == parsed.mounts


@pytest.mark.parametrize(
    ("second", "why"),
    [
        ("/home/work/data", "lies in mount 'a'"),
        ("/home/work/data/sub", "lies in mount 'a'"),
        ("/home/work", "system folder"),
    ],
)
def test_overlapping_mounts_are_refused(second: str, why: str) -> None:
    request = _request(
        KernelMount(name="a", host_path="/vol/a", kernel_path="/home/work/data"),
        KernelMount(name="b", host_path="/vol/b", kernel_path=second),
    )
    with pytest.raises(MountRefused, match=f"mount 'b': .*{why}"):
        build_kernel_spec(request, {}, {}, {}, {})
    covering = _request(
        KernelMount(name="a", host_path="/vol/a", kernel_path="/home/work/x/y"),
        KernelMount(name="b", host_path="/vol/b", kernel_path="/home/work/x"),
    )
    with pytest.raises(MountRefused, match=r"mount 'b': .*would cover mount 'a'"):
        build_kernel_spec(covering, {}, {}, {}, {})


def _sandbox_args(tmp_path: Path, *folders: FolderMount) -> list[str]:
    work, conf = tmp_path / "k" / "work", tmp_path / "k" / "config"
    for folder in (work, conf):
        folder.mkdir(parents=True, exist_ok=True)
    record = sandbox_record(
        SandboxConfig(),
        kernel_id="k",
        work_dir=work,
        config_dir=conf,
        cwd=work,
        program="/bin/sh",
        scratch_root=tmp_path,
        folder_mounts=folders,
    )
    return [str(a) for a in record["args"]]


def test_bwrap_binds_folders_after_the_work_folder(tmp_path: Path) -> None:
    work = tmp_path / "k" / "work"
    args = _sandbox_args(
        tmp_path,
        FolderMount("rw", "/vol/rw", "/home/work/rw"),
        FolderMount("ro", "/vol/ro", "/home/work/deep/ro", read_only=True),
        FolderMount("abs", "/vol/abs", "/datasets/abs", read_only=True),
    )
    triples = list(zip(args, args[1:], args[2:], strict=False))
    own = triples.index(("--bind", str(work), str(work)))
    rw = triples.index(("--bind", "/vol/rw", str(work / "rw")))
    ro = triples.index(("--ro-bind", "/vol/ro", str(work / "deep" / "ro")))
    absolute = triples.index(("--ro-bind", "/vol/abs", "/datasets/abs"))
    assert own < rw
    assert own < ro
    assert own < absolute
    # /datasets does not exist in the sandbox's root: made (0755) before the bind
    assert ("--dir", "/datasets") in itertools.pairwise(args)
    # the work folder is bound once, and never remade with --dir over the bind
    assert ("--dir", str(work)) not in itertools.pairwise(args)


@pytest.mark.parametrize("inside", ["k", "k/config", "k/config/x", "."])
def test_bwrap_refuses_folders_over_the_sandboxs_own_binds(tmp_path: Path, inside: str) -> None:
    target = os.path.normpath(tmp_path / inside)
    with pytest.raises(
        MountRefused, match=r"mount 'bad': kernel_path .* (would cover|lies inside)"
    ):
        _sandbox_args(tmp_path, FolderMount("bad", "/vol/x", target))


def test_docker_binds_folders_read_only_where_asked(tmp_path: Path) -> None:
    config = DockerRuntimeConfig(scratch_root=tmp_path, agent_id="i-1")
    spec = KernelSpec(
        kernel_id="k1",
        image="python:3.11",
        resource_txt="",
        folder_mounts=(
            FolderMount("rw", "/vol/rw", "/home/work/rw"),
            FolderMount("ro", "/vol/ro", "/data/ro", read_only=True),
        ),
    )
    body = container_config(spec, ScratchDir(tmp_path, "k1"), config)
    mounts = body["HostConfig"]["Mounts"]
    assert {"Type": "bind", "Source": "/vol/rw", "Target": "/home/work/rw", "ReadOnly": False} in (
        mounts
    )
    assert {"Type": "bind", "Source": "/vol/ro", "Target": "/data/ro", "ReadOnly": True} in mounts
    over = KernelSpec(
        kernel_id="k2",
        image="python:3.11",
        resource_txt="",
        folder_mounts=(FolderMount("cfg", "/vol/x", "/home/config/x"),),
    )
    with pytest.raises(MountRefused, match=r"mount 'cfg'"):
        container_config(over, ScratchDir(tmp_path, "k2"), config)
