"""The import directions the design promises (DESIGN §3: settings → engine/bridge → supervisor) and the wings'
rules (runtime/__init__.py), read from the source with `ast`, nothing imported: which wing may import which
(DIRECTIONS: the pod and the commands at the top, the libraries they call below them, the state files at the
bottom); nothing outside the pod imports it, nothing outside the commands imports them, and no command imports
another; the build side imports of the runtime only RunPod's wing and the root's leaves (modules that import nothing
of ours but other such leaves, found from the imports); the engine's helpers that run in vLLM's venv or at image
build import nothing of ours but themselves, nor do the packages that enclose them; no cycles.

Every import counts, those inside functions and those `if TYPE_CHECKING:` too (a type is a dependency,
and an import deferred into a function is a circle all the same), in the cycle check as in the rest.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("runtime", "space")
# The wings (runtime/__init__.py) and, for each, the wings it may import besides itself and the runtime's root
# modules: the directions, from the top (the pod's process, the commands on the user's machine) down to the state
# files. The pod runs its self-check with runtime/checks and stops itself with runtime/runpod, never a command.
POD, CLIENT, STATE, RUNPOD = "runtime.pod", "runtime.client", "runtime.state", "runtime.runpod"
BRIDGE, ENGINE, HUB, CHECKS, SIZING = (
    "runtime.bridge",
    "runtime.engine",
    "runtime.hub",
    "runtime.checks",
    "runtime.sizing",
)
DIRECTIONS: dict[str, frozenset[str]] = {
    POD: frozenset({BRIDGE, CHECKS, RUNPOD, ENGINE, HUB, STATE}),
    CLIENT: frozenset({CHECKS, SIZING, RUNPOD, ENGINE, HUB, STATE}),
    CHECKS: frozenset({RUNPOD, ENGINE}),
    SIZING: frozenset({RUNPOD, ENGINE, HUB}),
    BRIDGE: frozenset({STATE}),
    ENGINE: frozenset({STATE}),
    HUB: frozenset({STATE}),
    RUNPOD: frozenset(),
    STATE: frozenset(),
}
BUILD_SIDE = ("build.py", "space/", "docker/")
# They run in vLLM's venv (vllm_cli) or at image build (tinymodel), where the runtime may not be installed:
# each imports nothing of ours but itself (a package's modules import each other).
STANDALONE = ("runtime.engine.vllm_cli", "runtime.engine.tinymodel")


@dataclass(frozen=True)
class Import:
    source: str  # the importing file, relative to the repository
    line: int
    target: str  # the module imported (a package's submodule when `from package import submodule`)
    in_function: bool
    for_types: bool  # under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        where = " (for types only)" if self.for_types else " (in a function)" if self.in_function else ""
        return f"{self.source}:{self.line} imports {self.target}{where}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A source file's tree, parsed once for every rule that reads it."""
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path) -> Iterator[Import]:
    """Every import of our packages in `path`, wherever it stands in the file."""
    source, package = str(path.relative_to(ROOT)), module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]

    def visit(node: ast.AST, in_function: bool, for_types: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(source, node.lineno, alias.name, in_function, for_types)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's own package up
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield Import(source, node.lineno, submodule if is_module(submodule) else base, in_function, for_types)
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            types = for_types or (isinstance(node, ast.If) and is_type_checking(node.test) and child in node.body)
            yield from visit(child, inside, types)

    tree = parsed(path)
    yield from (i for i in visit(tree, False, False) if i.target.split(".")[0] in OURS)


def sources() -> list[Path]:
    files = [*ROOT.glob("runtime/**/*.py"), *ROOT.glob("space/**/*.py"), ROOT / "build.py", *ROOT.glob("docker/*.py")]
    return sorted(files)


IMPORTS = [i for path in sources() for i in imports_of(path)]


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def broken(rule: str, offending: list[Import]) -> str:
    return f"{rule}:\n  " + "\n  ".join(map(str, offending))


def test_the_parse_sees_the_imports_it_checks() -> None:
    """Guards the test itself: an import at module level, one in a function, one for types, one inside a
    standalone package, all seen; and STANDALONE names modules that are there."""
    seen = {(i.source, i.target, i.in_function, i.for_types) for i in IMPORTS}
    assert ("runtime/pod/start.py", "runtime.pod.supervisor", False, False) in seen
    assert ("runtime/pod/hubside.py", "runtime.hub", False, True) in seen
    assert any(source == "runtime/pod/start.py" and function for source, _, function, _ in seen)
    assert ("runtime/engine/tinymodel/checkpoint.py", "runtime.engine.tinymodel.script", False, False) in seen
    assert all(map(is_module, STANDALONE))


def wing_of(module: str) -> str | None:
    """The wing a module of ours belongs to (a package under runtime/ that DIRECTIONS names), None for the rest."""
    return next((wing for wing in DIRECTIONS if within(module, (wing,))), None)


def test_every_wing_is_in_the_directions() -> None:
    """A new package under runtime/ is placed in DIRECTIONS before any rule can hold for it."""
    packages = {f"runtime.{path.parent.name}" for path in ROOT.glob("runtime/*/__init__.py")}
    assert packages == set(DIRECTIONS), f"runtime/'s packages are not DIRECTIONS' wings: {packages ^ set(DIRECTIONS)}"


def test_each_wing_imports_only_the_wings_below_it() -> None:
    offending = []
    for i in IMPORTS:
        importer, target = wing_of(module_name(ROOT / i.source)), wing_of(i.target)
        if importer and target and target != importer and target not in DIRECTIONS[importer]:
            offending.append(i)
    assert not offending, broken("a wing imports only itself, the root's modules and its DIRECTIONS", offending)


def test_nothing_outside_the_pod_imports_the_pod() -> None:
    """The pod's process is the top of the runtime: `python -m runtime start` names it in a string, nothing imports it."""
    offending = [i for i in IMPORTS if not i.source.startswith("runtime/pod/") and within(i.target, (POD,))]
    assert not offending, broken("only runtime/pod/ imports runtime.pod", offending)


def test_nothing_outside_the_commands_imports_them() -> None:
    """The commands on the user's machine are the other top: the pod, the libraries, the root's modules and the build
    side never import them (runtime/cli.py names them in strings)."""
    offending = [i for i in IMPORTS if not i.source.startswith("runtime/client/") and within(i.target, (CLIENT,))]
    assert not offending, broken(f"only runtime/client/ imports {CLIENT}", offending)


def commands() -> list[str]:
    """The command modules of runtime/client/, as runtime/cli.py's table names them."""
    table = parsed(ROOT / "runtime" / "cli.py")
    named = (node.value for node in ast.walk(table) if isinstance(node, ast.Constant) and isinstance(node.value, str))
    return sorted({name for name in named if within(name, (CLIENT,)) and is_module(name)})


def test_no_command_imports_another() -> None:
    """What two commands share is a library (runtime/checks, runtime/sizing, runtime/runpod) or a shared module of the
    commands' wing (identity, environment, columns), never one command's module (or package) in another's."""
    own = commands()
    assert {"runtime.client.pods", "runtime.client.plan", "runtime.client.check"} <= set(own)
    offending = []
    for i in IMPORTS:
        importer = next((c for c in own if within(module_name(ROOT / i.source), (c,))), None)
        imported = next((c for c in own if within(i.target, (c,))), None)
        if importer and imported and importer != imported:
            offending.append(i)
    assert not offending, broken("a command imports no other command", offending)


def root_leaves() -> set[str]:
    """The runtime's root modules that import nothing of ours but other such leaves: all of them at first, then,
    until none is left to drop, those that import anything else are dropped."""
    leaves = {module_name(path) for path in ROOT.glob("runtime/*.py") if path.name != "__init__.py"}
    while dropped := {
        m for m in leaves for i in IMPORTS if module_name(ROOT / i.source) == m and i.target not in leaves
    }:
        leaves -= dropped
    return leaves


def test_the_build_side_imports_of_the_runtime_only_runpod_and_the_root_leaves() -> None:
    """build.py, space/ and docker/ take from the runtime RunPod's wing, and the root's leaves, which RunPod's wing
    imports alone of ours besides itself: nothing that pulls the pod, a command or the engine into the build."""
    leaves = root_leaves()
    assert {"runtime.units", "runtime.headers", "runtime.liveline"} <= leaves and "runtime.health" not in leaves
    build_side = [i for i in IMPORTS if i.source.startswith(BUILD_SIDE) and within(i.target, ("runtime",))]
    offending = [i for i in build_side if not within(i.target, (RUNPOD,)) and i.target not in leaves]
    assert build_side and not offending, broken(
        f"the build side imports only {RUNPOD} and the root's leaves", offending
    )
    from_runpod = [i for i in IMPORTS if i.source.startswith("runtime/runpod/") and not within(i.target, (RUNPOD,))]
    offending = [i for i in from_runpod if i.target not in leaves]
    assert not offending, broken(f"{RUNPOD} imports nothing of ours but itself and the root's leaves", offending)


def test_the_state_files_import_nothing_of_ours_but_each_other() -> None:
    """Every process of the pod reads them (the bridge, the pod, the probes): they pull nobody's code along."""
    offending = [i for i in IMPORTS if i.source.startswith("runtime/state/") and not within(i.target, (STATE,))]
    assert not offending, broken(f"runtime/state/ imports only {STATE}", offending)


def standalone_of(source: str) -> str | None:
    """The standalone module or package that the file `source` belongs to, if any."""
    return next((name for name in STANDALONE if within(module_name(ROOT / source), (name,))), None)


def enclosing(name: str) -> set[str]:
    """The packages Python runs before the module `name`: `runtime.engine.vllm_cli` → runtime, runtime.engine."""
    parts = name.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts))}


def test_what_runs_in_the_engines_venv_imports_nothing_of_ours_but_itself() -> None:
    offending = [i for i in IMPORTS if (unit := standalone_of(i.source)) and not within(i.target, (unit,))]
    assert not offending, broken(f"{' and '.join(STANDALONE)} import nothing from runtime/ but themselves", offending)
    # Their enclosing packages run first, wherever they run (the cpu image copies only their `__init__.py`).
    packages = set().union(*map(enclosing, STANDALONE))
    offending = [i for i in IMPORTS if module_name(ROOT / i.source) in packages]
    assert not offending, broken(f"{', '.join(sorted(packages))} import nothing from runtime/", offending)


def test_no_import_cycles_among_runtime_modules() -> None:
    """No imports form a cycle, wherever they stand (in a function, for types only); an import of a module's
    own enclosing package does not count (Python has begun that package already)."""
    graph: dict[str, set[str]] = {}
    for i in IMPORTS:
        importer = module_name(ROOT / i.source)
        if not within(importer, ("runtime",)) or importer.startswith(i.target + "."):
            continue
        graph.setdefault(importer, set()).add(i.target)
    cycles = {" → ".join(cycle) for start in graph for cycle in cycles_from(start, graph)}
    assert not cycles, "import cycles among runtime modules:\n  " + "\n  ".join(sorted(cycles))


def cycles_from(start: str, graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """Each path from `start` back to itself (depth first; every cycle appears once per member)."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    while stack:
        node, path = stack.pop()
        for successor in sorted(graph.get(node, ())):
            if successor == start:
                yield [*path, start]
            elif successor not in path:
                stack.append((successor, [*path, successor]))


def test_no_import_cycles_on_the_build_side_either() -> None:
    """The same rule for build.py, space/ and docker/: every importer's edges, not the runtime's alone."""
    graph: dict[str, set[str]] = {}
    for i in IMPORTS:
        importer = module_name(ROOT / i.source)
        if importer.startswith(i.target + "."):
            continue
        graph.setdefault(importer, set()).add(i.target)
    cycles = {" → ".join(cycle) for start in graph for cycle in cycles_from(start, graph)}
    assert not cycles, "import cycles:\n  " + "\n  ".join(sorted(cycles))


# Names that are loggers' only, never imported: a logger named like a module that does not exist.
LOGGER_NAMES = frozenset({"runtime.tracebacks", "runtime.hub.log", "runtime.hub.config"})
DOTTED = re.compile(r"runtime(?:\.\w+)+")


def named_in_strings(path: Path) -> Iterator[tuple[str, int, str]]:
    """(file, line, name) for each string that names one of our modules (or a module's attribute), as the
    commands table, vLLM's --middleware, websockify's auth plugin and `python -m` lines do; loggers' names and
    the arguments of getLogger are left out."""
    tree = parsed(path)
    loggers = {
        id(argument)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "getLogger"
        for argument in node.args
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in loggers:
            for name in DOTTED.findall(node.value):
                if name not in LOGGER_NAMES:
                    yield str(path.relative_to(ROOT)), node.lineno, name


def resolves(name: str) -> bool:
    """Whether `name` is one of our modules, or a top-level name a module of ours defines."""
    if is_module(name):
        return True
    module, _, attribute = name.rpartition(".")
    if not is_module(module):
        return False
    base = ROOT.joinpath(*module.split("."))
    path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    defined = set()
    for node in parsed(path).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):  # a name a module passes on
            defined |= {alias.asname or alias.name for alias in node.names}
    return attribute in defined


# Python run from outside the checked tree (mypy reads runtime/, space/, build.py and docker/ only): the README's
# first command and the benchmarks. An import of ours there breaks only when a user runs it.
SCRIPTS = [ROOT / "scripts" / "demo", *sorted(ROOT.glob("benchmarks/*.py"))]


def test_every_name_the_scripts_import_of_ours_exists() -> None:
    """scripts/demo imported a name that had moved (runtime.client.identity's api_headers): the demo failed at its
    wait for the model, and only a run of the demo could see it."""
    imported = [
        (path.relative_to(ROOT), node.lineno, f"{node.module}.{alias.name}")
        for path in SCRIPTS
        for node in ast.walk(parsed(path))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in OURS
        for alias in node.names
    ]
    assert any(name == "runtime.headers.api_headers" for _, _, name in imported)
    missing = [f"{source}:{line} imports {name}" for source, line, name in imported if not resolves(name)]
    assert not missing, "scripts import names that do not exist:\n  " + "\n  ".join(missing)


def test_every_module_named_in_a_string_resolves() -> None:
    """A module named in a string (the commands table, vLLM's --middleware, websockify's auth plugin, the vLLM
    CLI's `python -m`) is checked by no import: a rename would break it only on a pod."""
    named = [entry for path in sources() for entry in named_in_strings(path)]
    assert {"runtime.bridge.auth.EngineKeys", "runtime.engine.vllm_cli", "runtime.client.pods"} <= {
        n for _, _, n in named
    }
    unresolved = [f"{source}:{line} names {name}" for source, line, name in named if not resolves(name)]
    assert not unresolved, "strings name modules that do not exist:\n  " + "\n  ".join(unresolved)
