"""The layout of docs/architecture.md, held against the code: every module of src/troll sits in a layer, imports
only layers below its own (or its own package), the two wings and the two applications never import each other,
no module imports itself back through others, and no module is over 600 lines; tests/ is laid out like src/troll."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
SUPPORT = TESTS / "support"  # helpers and torchrun scripts, imported by name (pyproject's pythonpath)

# package -> layer, lowest first (docs/architecture.md's picture); a module belongs to its longest matching prefix
LAYERS = {
    "troll._threads": 1,
    "troll.citation": 1,
    "troll.rootfind": 1,
    "troll.runs": 1,
    "troll.output": 1,
    "troll.sandbox": 1,
    "troll._checks": 2,
    "troll.study": 2,
    "troll.categorical": 3,
    "troll.gaussian": 3,
    "troll.episodic.envs": 3,
    "troll.integrations": 4,
    "troll.episodic": 4,
    "troll.lm": 5,
    "troll.tce": 5,
    "troll.cli": 6,
}
FACE = "troll"  # the face: it names its exports as strings and imports them on first use (checked below)


def _name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str | None:
    found = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    return max(found, key=len) if found else None


def _module_path(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(path: Path, module: str) -> set[str]:
    """The troll modules ``path`` imports anywhere (lazily inside functions too), outside ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text())
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            skipped.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:  # "from troll.lm import options" imports the module troll.lm.options
                sub = f"{node.module}.{alias.name}"
                found.add(sub if _module_path(sub) else node.module)
    return {m for m in found if m == "troll" or m.startswith("troll.")} - {module}


MODULES = {_name(p): p for p in sorted((SRC / "troll").rglob("*.py"))}
GRAPH = {name: _imports(path, name) for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    assert not [m for m in MODULES if m != FACE and _package(m) is None], "add the package to LAYERS and the docs"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != FACE))
def test_imports_run_down(module):
    mine = _package(module)
    for imported in GRAPH[module]:
        if imported == FACE:  # its version and lazy names: it imports nothing itself
            continue
        theirs = _package(imported)
        assert theirs is not None, f"{module} imports {imported}, no module of src/troll"
        if theirs == mine:
            continue
        assert LAYERS[theirs] < LAYERS[mine], (
            f"{module} (layer {LAYERS[mine]}) imports {imported} (layer {LAYERS[theirs]}): imports run down only"
        )


def test_no_circle():
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(GRAPH.get(name, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join([*trail[trail.index(nxt) :], nxt]))
            if nxt in GRAPH and not state.get(nxt):
                visit(nxt, [*trail, nxt])
        state[name] = 2

    for name in GRAPH:
        if not state.get(name):
            visit(name, [name])


def test_the_layer_table_catches_an_upward_import():
    # the rule itself: a wing importing an application, or one wing the other, is refused
    assert LAYERS[_package("troll.integrations.trl.trainer")] > LAYERS[_package("troll.categorical.losses")]
    assert LAYERS[_package("troll.gaussian.loss")] == LAYERS[_package("troll.categorical.batch")]
    assert _package("troll.categorical.losses") != _package("troll.gaussian.loss")


def test_modules_stay_under_600_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"split these modules: {long}"


def test_the_face_imports_nothing_of_its_own():
    assert GRAPH[FACE] <= {"troll"}, "troll/__init__.py must stay lazy: name exports in _EXPORTS"


def test_the_run_layer_imports_nothing_above_it():
    """troll.runs is below study/, lm/ and episodic/ and torch-free: its modules import only the standard library and
    each other."""
    for path in sorted((SRC / "troll" / "runs").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                top = name.split(".")[0]
                ok = name.startswith("troll.runs") or top == "__future__" or top in sys.stdlib_module_names
                assert ok, f"{path.name} imports {name}"


# ---------------------------------------------------------------- two applications of one shape

APPLICATIONS = ("troll.lm", "troll.tce")
# the rooms every application has: its command line, its flag table, one run, its study frontend, where its studies'
# cells stand (troll status, troll tce status)
ROOMS = ("cli", "flags", "run", "study", "status")


@pytest.mark.parametrize("app", APPLICATIONS)
def test_each_application_has_the_same_rooms(app):
    missing = [room for room in ROOMS if f"{app}.{room}" not in MODULES]
    assert not missing, f"{app} lacks {missing}: each application has {ROOMS} (docs/architecture.md)"
    assert LAYERS[app] == max(LAYERS[a] for a in APPLICATIONS), "the applications stand on one floor"


def test_the_command_line_package_is_the_dispatcher_alone():
    """troll.cli holds the dispatcher; each application's subcommands are in its own cli.py (a provider)."""
    assert sorted(m for m in MODULES if m.startswith("troll.cli.")) == ["troll.cli.__main__"]
    providers = ast.literal_eval(
        next(n.value for n in ast.parse(MODULES["troll.cli"].read_text()).body
             if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PROVIDERS")
    )  # fmt: skip
    assert providers == tuple(f"{app}.cli" for app in APPLICATIONS)


def test_each_library_stands_below_its_application():
    """A user imports a library without its application: troll.episodic (ProDMP, the agent, TCE and BBRL, the
    environments) beside troll.integrations, under troll.tce (its command line) as troll.integrations is under
    troll.lm; the environments stand below the agent, on the wings' floor."""
    assert LAYERS["troll.episodic.envs"] < LAYERS["troll.episodic"] < LAYERS["troll.tce"]
    assert LAYERS["troll.episodic"] == LAYERS["troll.integrations"] and LAYERS["troll.tce"] == LAYERS["troll.lm"]
    assert _package("troll.episodic.agent") == "troll.episodic"
    assert _package("troll.tce.run") == "troll.tce"
    library = [m for m in MODULES if _package(m) in ("troll.episodic", "troll.episodic.envs")]
    assert library and not [(m, i) for m in library for i in GRAPH[m] if _package(i) in APPLICATIONS]


# ---------------------------------------------------------------- tests/ laid out like src/troll


def _test_folders() -> list[Path]:
    """Every folder of tests/ with Python files in it, but tests/ itself and tests/support/."""
    folders = {p.parent for p in TESTS.rglob("*.py")} - {TESTS}
    return sorted(f for f in folders if f != SUPPORT and SUPPORT not in f.parents)


def test_every_test_folder_is_a_source_package():
    """tests/<path>/ holds the tests of the package troll.<path> (src/troll/<path>/), and is a package itself, so that
    pytest names its modules by their path and puts no test folder on sys.path (tests/integrations/verl would import
    as ``verl`` otherwise)."""
    folders = [f.relative_to(TESTS) for f in _test_folders()]
    assert folders, "no test folder found"
    alien = [f"tests/{f}/" for f in folders if not (SRC / "troll" / f / "__init__.py").is_file()]
    assert not alien, f"{alien}: each test folder must be named after a package of src/troll (docs/architecture.md)"
    loose = [f"tests/{f}/" for f in folders if not (TESTS / f / "__init__.py").is_file()]
    assert not loose, f"{loose}: add an empty __init__.py"


# the TRL and verl test files keep the integration's name, which their docs and make targets cite
NAMED_AFTER_THEIR_INTEGRATION = {TESTS / "integrations" / "trl", TESTS / "integrations" / "verl"}


def test_test_files_have_one_prefix():
    """A test module is test_<module>[_<aspect>].py in the folder of its package: never prefixed with the package's
    own name again (tests/gaussian/test_gaussian_loss.py is tests/gaussian/test_loss.py)."""
    doubled = [
        str(p.relative_to(TESTS))
        for p in sorted(TESTS.rglob("test_*.py"))
        if p.parent not in NAMED_AFTER_THEIR_INTEGRATION and p.stem.startswith(f"test_{p.parent.name}_")
    ]
    assert not doubled, f"{doubled}: drop the folder's name from the file's"


# tests/<path>/test_<module>.py and test_<module>_<aspect>.py test src/troll/<path>/<module>.py; a folder's own name
# stands for its package (tests/cli/test_cli.py tests src/troll/cli/__init__.py) and a private module is named without
# its underscore (test_threads.py would test _threads.py). These files go through several modules on purpose:
CROSS_CUTTING = {
    "test_architecture.py": "the layout of src/troll and of tests/",
    "test_doc_references.py": "the pointers to docs sections in code and docs",
    "test_examples.py": "the scripts of examples/, run end to end",
    "test_experiments.py": "the scripts of experiments/, their options",
    "test_stability_map.py": "experiments/stability_map.py, the stability map's report, on fabricated study folders",
    "categorical/test_bad_input.py": "bad input to every public function of the wing, refused by name",
    "categorical/test_properties.py": "hypothesis properties of the projection and the losses on it",
    "gaussian/test_bad_input.py": "bad input to every public function of the wing, refused by name (_checks.py too)",
    "gaussian/test_extremes.py": "extreme but valid inputs to every projection, against the reference",
    "gaussian/test_gradients.py": "the backward passes of projection.py, kl.py and distances.py, three ways",
    "gaussian/test_properties.py": "hypothesis properties of every Gaussian projection",
}


def _module_names(folder: Path) -> set[str]:
    """What a test file of ``folder`` may be named after: the modules of the package it mirrors (a private one without
    its underscore) and the package itself."""
    package = SRC / "troll" / folder.relative_to(TESTS)
    modules = {p.stem.lstrip("_") for p in package.glob("*.py") if not p.stem.startswith("__")}
    return modules | {package.name}


def test_every_test_file_is_named_after_the_module_it_tests():
    files = [p for p in sorted(TESTS.rglob("test_*.py")) if SUPPORT not in p.parents]
    assert files, "no test file found"
    unnamed = []
    for path in files:
        rel = path.relative_to(TESTS).as_posix()
        stem = path.stem.removeprefix("test_")
        named = any(stem == m or stem.startswith(f"{m}_") for m in _module_names(path.parent))
        if not named and rel not in CROSS_CUTTING:
            unnamed.append(f"tests/{rel}")
    assert not unnamed, (
        f"{unnamed}: name a test file after the module of src/troll/<same folders> it tests (test_<module>.py or "
        "test_<module>_<aspect>.py), or list it in CROSS_CUTTING with the reason"
    )
    gone = sorted(f for f in CROSS_CUTTING if not (TESTS / f).is_file())
    assert not gone, f"CROSS_CUTTING lists files that are gone: {gone}"


def test_helpers_live_in_tests_support():
    """Outside tests/support/ every Python file is a test module, a package's __init__.py or a conftest.py: the suite's,
    and the verl folder's (it starts the end-to-end runs in the background when the session starts)."""
    allowed = {TESTS / "conftest.py", TESTS / "integrations" / "verl" / "conftest.py"}
    stray = [
        str(p.relative_to(TESTS.parent))
        for p in sorted(TESTS.rglob("*.py"))
        if SUPPORT not in p.parents and p not in allowed and not p.name.startswith("test_") and p.name != "__init__.py"
    ]
    assert not stray, f"{stray}: move helpers to tests/support/ (imported by name there)"
