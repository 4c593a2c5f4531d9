"""The tests' own layout (issue #38), read with `ast`: datasets live in tests/_datasets/ (or
tests/_vision_datasets.py), not in a test file; no test name is defined in two files (one
behaviour, one test); no test file passes 1,000 lines."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).parent
DATASET_MODULES = ("_datasets/*.py", "_vision_datasets.py")
# The classes a dataset derives from, by the name its base is written with (tud.Dataset,
# rloader.IterableDataset[int], RV.ImageFolder, ...): torch's, rloader's and torchvision's.
DATASET_BASES = {"Dataset", "IterableDataset", "ImageFolder", "DatasetFolder", "VisionDataset"}
MAX_LINES = 1000


def files_of_tests() -> list[Path]:
    return sorted(TESTS.glob("test_*.py"))


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def base_name(node: ast.expr) -> str | None:
    """The last name a base is written with: `tud.Dataset[int]` -> "Dataset"."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def dataset_classes(tree: ast.Module, known: set[str]) -> list[ast.ClassDef]:
    """The module-level classes of ``tree`` that derive from a dataset: from one of
    DATASET_BASES, one of ``known`` (the shared modules' datasets), or one defined above."""
    known = DATASET_BASES | known
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(base_name(b) in known for b in node.bases):
            found.append(node)
            known = known | {node.name}
    return found


def shared_datasets() -> set[str]:
    """The datasets the shared modules define (a base in another of them counts: read until
    no new one is found)."""
    modules = [path for pattern in DATASET_MODULES for path in sorted(TESTS.glob(pattern))]
    names: set[str] = set()
    while True:
        found = {c.name for path in modules for c in dataset_classes(parsed(path), names)}
        if found <= names:
            return names
        names |= found


def datasets_defined(paths: list[Path], known: set[str]) -> list[str]:
    """Each dataset class defined at module level in ``paths``, as "file:line Name"."""
    return [
        f"{path.name}:{c.lineno} {c.name}"
        for path in paths
        for c in dataset_classes(parsed(path), known)
    ]


def names_in_two_files(paths: list[Path]) -> dict[str, list[str]]:
    """Each module-level test function name defined in more than one of ``paths``: its files."""
    files_of = defaultdict(set)
    for path in paths:
        for node in parsed(path).body:
            is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_function and node.name.startswith("test_"):
                files_of[node.name].add(path.name)
    return {name: sorted(files) for name, files in files_of.items() if len(files) > 1}


def long_files(paths: list[Path]) -> dict[str, int]:
    lines = {path.name: len(path.read_text().splitlines()) for path in paths}
    return {name: n for name, n in lines.items() if n > MAX_LINES}


def test_no_test_file_defines_a_dataset():
    defined = datasets_defined(files_of_tests(), shared_datasets())
    assert defined == [], "move these to tests/_datasets/:\n" + "\n".join(defined)


def test_no_test_name_is_defined_in_two_files():
    assert names_in_two_files(files_of_tests()) == {}


def test_no_test_file_passes_a_thousand_lines():
    assert long_files(files_of_tests()) == {}


def test_no_shared_module_passes_five_hundred_lines():
    # (the package's rule for a module, for the modules the tests share)
    shared = sorted(TESTS.glob("_*.py")) + sorted(TESTS.glob("_datasets/*.py"))
    lines = {path.name: len(path.read_text().splitlines()) for path in shared}
    assert {name: n for name, n in lines.items() if n > 500} == {}


def test_the_checks_see_what_they_look_for(tmp_path):
    # Each check fails on files that break its rule: a check that sees nothing cannot pass as
    # a tidy tree.
    one, two = tmp_path / "test_one.py", tmp_path / "test_two.py"
    one.write_text(
        "import torch.utils.data as tud\n"
        "class A(tud.Dataset): pass\n"
        "class B(A): pass\n"
        "class C(rloader.IterableDataset[int]): pass\n"
        "class D(Squares): pass\n"
        "class Clock: pass\n"
        "def test_x():\n"
        "    class Inner(tud.Dataset): pass\n"
        "def test_y(): pass\n" + "\n" * MAX_LINES
    )
    two.write_text("async def test_x(): pass\ndef test_z(): pass\n")
    assert datasets_defined([one, two], {"Squares"}) == [
        "test_one.py:2 A",
        "test_one.py:3 B",
        "test_one.py:4 C",
        "test_one.py:5 D",
    ]
    assert names_in_two_files([one, two]) == {"test_x": ["test_one.py", "test_two.py"]}
    assert long_files([one, two]) == {"test_one.py": MAX_LINES + 9}
    assert "Squares" in shared_datasets() and "Clock" not in shared_datasets()
