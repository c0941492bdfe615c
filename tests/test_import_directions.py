"""The import directions the design promises (DESIGN §3: settings → engine/bridge → supervisor) and the wings'
rules (runtime/__init__.py), read from the source with `ast`, nothing imported: the bridge never imports the pod,
the client side, the engine or the Hub code; nothing outside the pod imports it; the pod takes from the client side
only the checks it runs on itself; the state files import only each other; the build side imports nothing of the
runtime but its standard-library leaves; the engine's helpers that run in vLLM's venv or at image build import
nothing of ours but themselves, nor do the packages that enclose them; no cycles.

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
# The wings (runtime/__init__.py). The pod's process is the top: nothing outside it imports it. The commands on
# the user's machine never reach it: what it runs on itself (VL_SELFCHECK) is runtime/checks', the RunPod client it
# stops itself with (VL_IDLE_STOP_MIN) runtime/runpod's.
POD, CLIENT, STATE = "runtime.pod", "runtime.client", "runtime.state"
BRIDGE_NEVER = ("runtime.engine", "runtime.hub", POD, CLIENT)
# What the build side (build.py, space/, docker/) may take from the runtime: standard-library-only leaves.
BUILD_MAY = (
    "runtime.packages",
    "runtime.units",
    "runtime.liveline",
    "runtime.runpod",
    "runtime.headers",
    "runtime.tokenshapes",
    "runtime.hubspace",
)  # httpx at most
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


def test_the_bridge_never_imports_the_pod_the_client_side_the_engine_or_the_hub() -> None:
    offending = [i for i in IMPORTS if i.source.startswith("runtime/bridge/") and within(i.target, BRIDGE_NEVER)]
    assert not offending, broken(f"the bridge imports nothing of {', '.join(BRIDGE_NEVER)}", offending)


def test_the_build_side_imports_nothing_of_the_runtime_but_the_package_table() -> None:
    build_side = [i for i in IMPORTS if not i.source.startswith("runtime/")]
    offending = [i for i in build_side if within(i.target, ("runtime",)) and not within(i.target, BUILD_MAY)]
    assert not offending, broken(
        f"build.py, space/ and docker/ import only {', '.join(BUILD_MAY)} from runtime/", offending
    )


def test_nothing_outside_the_pod_imports_the_pod() -> None:
    """The pod's process is the top of the runtime: `python -m runtime start` names it in a string, nothing imports it."""
    offending = [i for i in IMPORTS if not i.source.startswith("runtime/pod/") and within(i.target, (POD,))]
    assert not offending, broken("only runtime/pod/ imports runtime.pod", offending)


def test_the_pod_never_imports_the_client_side() -> None:
    """The commands on the user's machine never reach a pod's process: its self-check is runtime/checks'."""
    offending = [i for i in IMPORTS if i.source.startswith("runtime/pod/") and within(i.target, (CLIENT,))]
    assert not offending, broken(f"runtime/pod/ imports nothing of {CLIENT}", offending)


def test_the_client_side_is_imported_by_no_other_wing() -> None:
    """The commands on the user's machine are theirs: the bridge, the engine, the Hub side, the state files and the
    shared leaves never import them (the pod and the build side neither, above)."""
    others = [
        i
        for i in IMPORTS
        if i.source.startswith("runtime/") and not i.source.startswith(("runtime/pod/", "runtime/client/"))
    ]
    offending = [i for i in others if within(i.target, (CLIENT,))]
    assert not offending, broken(f"only runtime/client/ imports {CLIENT}", offending)


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
    return attribute in defined


def test_every_module_named_in_a_string_resolves() -> None:
    """A module named in a string (the commands table, vLLM's --middleware, websockify's auth plugin, the vLLM
    CLI's `python -m`) is checked by no import: a rename would break it only on a pod."""
    named = [entry for path in sources() for entry in named_in_strings(path)]
    assert {"runtime.bridge.auth.EngineKeys", "runtime.engine.vllm_cli", "runtime.client.pods"} <= {
        n for _, _, n in named
    }
    unresolved = [f"{source}:{line} names {name}" for source, line, name in named if not resolves(name)]
    assert not unresolved, "strings name modules that do not exist:\n  " + "\n  ".join(unresolved)
