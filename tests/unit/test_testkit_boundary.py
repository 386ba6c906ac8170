"""The product (``src/accelshare``) never imports the test kit (``src/accelshare_testkit``),
which is not in the wheel: an import of it would fail on every installed machine."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
KIT = "accelshare_testkit"


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_no_product_module_imports_the_test_kit() -> None:
    modules = sorted((SRC / "accelshare").rglob("*.py"))
    assert len(modules) > 100  # the walk found the product's modules
    offenders = [
        f"{path.relative_to(SRC)}: {name}"
        for path in modules
        for name in _imported_modules(path)
        if name == KIT or name.startswith(KIT + ".")
    ]
    assert offenders == []


def test_the_product_has_no_test_package_of_its_own() -> None:
    kits = sorted(
        str(path.relative_to(SRC))
        for path in (SRC / "accelshare").rglob("testing*")
        if path.name in {"testing", "testing.py"}
    )
    assert kits == []


def test_the_checker_sees_an_import_of_the_kit(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import accelshare_testkit.servers\n"
        "def f():\n"
        "    from accelshare_testkit.hollow_agent import HollowAgent\n"
        "from . import sibling\n"
    )
    assert _imported_modules(sample) == [
        "accelshare_testkit.servers",
        "accelshare_testkit.hollow_agent",
    ]
