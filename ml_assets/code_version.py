"""Code versions: what marks an asset changed in the UI, and what a reproduction must run.

A stage's code version is derived, not listed: it hashes every module of this package that its
asset module imports, directly or through other modules (imports inside functions included: they
are code the stage runs), plus the roots a stage starts in another process (the trainer under
torchrun, a study's workers), the spec sections it reads and a model factory's pinned code. The
imports are read from the source files, not executed, so building definitions imports neither
torch nor scikit-learn; each file is read and scanned once per process.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

from ml_assets.settings import PACKAGE_DIR
from ml_assets.spec import ModelSpec
from ml_assets.spec.architecture import ArchitectureSpec
from ml_assets.trainer import code_pin

PACKAGE = "ml_assets"


@functools.cache
def module_file(name: str) -> Path | None:
    """The source file of a module of this package (a package's ``__init__.py``), or None."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def _read(path: Path, module: str) -> tuple[str, tuple[str, ...]]:
    """The file's sha256 and the names its import statements may load."""
    data = path.read_bytes()
    names = imported_names(data.decode(), module, path.name == "__init__.py")
    return hashlib.sha256(data).hexdigest(), tuple(names)


_IMPORT = re.compile(r"import\s+(.+)")
_FROM = re.compile(r"from\s+(\.*)([\w.]*)\s+import\s+(.+)", re.S)
_GUARD = re.compile(r"(el)?if\b.*\bTYPE_CHECKING\b.*:$")


def _statements(text: str) -> Iterator[tuple[int, str]]:
    """(indent, code) of each line outside triple-quoted strings, comments cut, an import's
    continuation lines joined to it."""
    quote = None
    lines = iter(text.splitlines())
    for line in lines:
        if quote is not None:
            quote = None if line.count(quote) % 2 else quote
            continue
        code = line.strip().split("#", 1)[0].rstrip()
        quote = next((q for q in ('"""', "'''") if code.count(q) % 2), None)
        if code.startswith(("import ", "from ")):
            while code.endswith("\\") or code.count("(") > code.count(")"):
                code = code.rstrip("\\") + " " + next(lines, "").split("#", 1)[0].strip()
        yield len(line) - len(line.lstrip()), code


def imported_names(text: str, module: str, is_package: bool) -> Iterator[str]:
    """Every module name an import statement in ``text`` may load (``from a import b`` may be the
    module ``a.b`` or a name in ``a``: both are returned), outside ``if TYPE_CHECKING:`` blocks, at
    any depth (in functions too). A line scanner, not ``ast``: parsing the ~200 modules a location's
    stages import took ~0.6 s of every run worker's start. A test holds it equal to ``ast``'s
    reading for every module of the package, so a statement it would misread fails there."""
    guard = None  # the indent of an `if TYPE_CHECKING:` whose body is skipped
    for indent, code in _statements(text):
        if not code or (guard is not None and indent > guard):
            continue
        if guard is not None:
            guard = None
            if code.startswith("else"):
                continue
        if _GUARD.match(code):
            guard = indent
        elif match := _IMPORT.fullmatch(code):
            yield from (part.split(" as ")[0].strip() for part in match[1].split(","))
        elif match := _FROM.fullmatch(code):
            dots, base = len(match[1]), match[2]
            if dots:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (dots - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            names = match[3].strip().strip("()").split(",")
            yield from (f"{base}.{part.split(' as ')[0].strip()}" for part in names if part.strip())


@functools.cache
def imports_of(module: str) -> frozenset[str]:
    """The modules of this package that ``module`` imports, its parent packages included (importing
    ``a.b.c`` runs ``a`` and ``a.b`` first)."""
    path = module_file(module)
    if path is None:
        raise ValueError(f"code_version: no module {module!r} in {PACKAGE}")
    if module == PACKAGE:
        # Its one import (the definitions, on first access to ``ml_assets.code_location``) runs when
        # Dagster loads the code location, never inside a stage; followed, it would make every
        # stage depend on all of them.
        return frozenset()
    # The module's own parent packages ran before it did: not what it imports.
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    found = set()
    for name in _read(path, module)[1]:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            candidate = ".".join(parts[:i])
            if candidate != module and candidate not in own and module_file(candidate) is not None:
                found.add(candidate)
    return frozenset(found)


@functools.cache
def closure(roots: tuple[str, ...]) -> tuple[str, ...]:
    """``roots`` and every module of this package they import, transitively, sorted."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(imports_of(module) - seen)
    return tuple(sorted(seen))


@functools.cache
def _closure_digest(roots: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for module in closure(roots):
        digest.update(module.encode())
        digest.update(_read(module_file(module), module)[0].encode())
    return digest.hexdigest()


def _outside_digest(name: str) -> str:
    """A module from outside this package (a custom transform's), hashed whole, a package with all its files."""
    found = importlib.util.find_spec(name)
    if found is None or found.origin is None:
        raise ValueError(f"code_version: no module {name!r}")
    digest = hashlib.sha256()
    for path in (sorted(Path(found.origin).parent.rglob("*.py")) if found.submodule_search_locations
                 else [Path(found.origin)]):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def code_version(spec: ModelSpec, sections: tuple[str, ...], *roots: str,
                 factory: ArchitectureSpec | None = None) -> str:
    """Changes when the spec ``sections`` a stage reads, or the code it runs, change.

    ``roots``: the stage's asset module (its ``__name__``) and the modules it runs in other
    processes; every module of this package they import counts. A root from outside this package
    (a custom transform's module) is hashed whole. ``factory``: a model factory, pinned as the
    trainer pins it (ml_assets.trainer.code_pin).
    """
    digest = hashlib.sha256(spec.fingerprint(*sections).encode())
    if factory is not None and factory.module:
        digest.update(code_pin.content(factory.module, factory.code_path or "")[1].encode())
    ours = tuple(sorted({r for r in roots if module_file(r) is not None}))
    digest.update(_closure_digest(ours).encode())
    for name in roots:
        if name not in ours:
            digest.update(_outside_digest(name).encode())
    return digest.hexdigest()[:16]


@functools.cache
def package_code_version() -> str:
    """A hash of the ml_assets package's source: what a reproduction must run."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
