"""The demo environments of ``accelshare dev up`` are built offline and kept."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

from accelshare.devcluster.catalogue import (
    DEMO_LIB_VERSIONS,
    build_environments,
    demo_images,
    environment_tables,
    python_ref,
)

CHECK = (
    "import demo_lib, importlib.metadata as m; print(demo_lib.__version__, m.version('demo-lib'))"
)


def test_two_venvs_hold_two_versions_and_a_rebuild_keeps_them(tmp_path: Path) -> None:
    built = build_environments(tmp_path)
    assert sorted(built) == list(DEMO_LIB_VERSIONS)
    for version, venv in built.items():
        out = subprocess.run(
            [str(venv / "bin" / "python"), "-c", CHECK], capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == [version, version]
    marker = built["1.0"] / "kept"
    marker.write_text("")
    build_environments(tmp_path)  # a second start keeps what is there
    assert marker.exists()


def test_agent_toml_tables_name_each_image_by_its_reference(tmp_path: Path) -> None:
    images = demo_images(tmp_path, ("cuda",))
    tables = tomllib.loads(environment_tables(images))["container"]["environments"]
    assert set(tables) == {python_ref(), "demo-lib:1.0", "demo-lib:2.0"}
    venv = tmp_path / "envs" / "demo-lib-2.0"
    assert tables["demo-lib:2.0"] == {
        "command-prefix": [str(venv / "bin" / "python")],
        "image-dir": str(venv),
        "env": {"VIRTUAL_ENV": str(venv)},
    }
    by_ref = {i.ref: i for i in images}
    assert by_ref[python_ref()].aliases == ("python",)
    assert by_ref[python_ref()].accelerators == ("cuda",)
    assert by_ref["demo-lib:2.0"].aliases == ("demo-lib",)
