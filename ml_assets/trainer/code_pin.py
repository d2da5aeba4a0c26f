"""Pin a factory's code by content, so a trained model names the exact code that built it (no torch
here: the Dagster side pins code before anything is trained).

The pin covers the top-level package the import path starts with (every ``.py`` file under it, or
the one module file), found without importing it. When that package is an installed distribution,
the pin also names the distribution and its version. ``sha256`` is one digest over the sorted
(relative path, file sha256) pairs: it goes into the training config's fingerprint (so changed code
never resumes another code's checkpoints), the trained checkpoint's code version and the registered
version's tags; ``changed`` names the files that differ when the code on disk no longer matches.

What the package imports from elsewhere (torch, numpy, other packages) is pinned by the environment
(the registered model's requirements), not here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import json
import re
import sys
from pathlib import Path

IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
SKIPPED_DIRS = {"__pycache__", ".git", ".mypy_cache", ".pytest_cache"}


class ModelContractError(ValueError):
    """A factory that cannot be imported, rejects its hyperparameters, returns no module, or gives
    outputs of the wrong shape. The message names the spec field and the import path."""


def check_import_path(path: str, where: str = "model.module") -> str:
    """A dotted module path, a colon, a name: checked before it reaches an import."""
    if not isinstance(path, str) or not IMPORT_PATH.match(path):
        raise ModelContractError(f"{where}: {path!r} is not 'package.module:factory' (dotted Python names)")
    return path


def package_root(import_path: str, code_path: str = "") -> Path:
    """The directory of the top-level package (or the file of the top-level module) of an import path,
    searched in ``code_path`` first, then on ``sys.path``; nothing is imported."""
    top = check_import_path(import_path).split(":")[0].split(".")[0]
    search = [p for p in (code_path, *sys.path) if p]
    spec = importlib.machinery.PathFinder.find_spec(top, search)
    if spec is None or (spec.origin is None and not spec.submodule_search_locations):
        where = f"{code_path} or " if code_path else ""
        raise ModelContractError(f"model.module: no package {top!r} (from {import_path!r}) in {where}the installed "
                                 "packages")
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).resolve()
    return Path(spec.origin).resolve()


def source_files(root: Path) -> dict[str, str]:
    """relative path -> sha256 of each .py file of a package directory (or of one module file)."""
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    files = {}
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_DIRS & set(path.relative_to(root).parts):
            continue
        files[f"{root.name}/{path.relative_to(root).as_posix()}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


@functools.cache
def _installed() -> dict[str, list[str]]:
    """Top-level package -> distributions, read once per process (it reads every package's metadata)."""
    from importlib.metadata import packages_distributions

    return packages_distributions()


def _distribution(top: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    for name in _installed().get(top, []):
        try:
            return {"distribution": name, "version": version(name)}
        except PackageNotFoundError:
            continue
    return {}


def content(import_path: str, code_path: str = "") -> tuple[dict[str, str], str]:
    """The package's files (relative path -> sha256) and the one digest over them: what a pin pins,
    without looking up the installed distributions (code versions and verification need no more)."""
    files = source_files(package_root(import_path, code_path))
    return files, hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()


def pin(import_path: str, code_path: str = "") -> dict:
    """``{"module", "package", "files", "sha256"[, "distribution", "version"]}`` of an import path."""
    files, digest = content(import_path, code_path)
    top = import_path.split(":")[0].split(".")[0]
    return {"module": import_path, "package": top, "files": files, "sha256": digest, **_distribution(top)}


def changed(pinned: dict, current: dict) -> list[str]:
    """The files that differ between two pins: changed, added or removed."""
    old, new = pinned.get("files", {}), current.get("files", {})
    return sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))


def verify(pinned: dict, code_path: str = "") -> None:
    """Raise, naming the changed files, unless the code on disk is the pinned code."""
    files, digest = content(pinned["module"], code_path)
    if digest != pinned["sha256"]:
        files = changed(pinned, {"files": files})
        raise ModelContractError(
            f"model.module: the code of {pinned['module']} changed since it was pinned (sha256 "
            f"{pinned['sha256'][:12]}, now {digest[:12]}): {', '.join(files[:10])}"
            + (f" and {len(files) - 10} more" if len(files) > 10 else ""))
