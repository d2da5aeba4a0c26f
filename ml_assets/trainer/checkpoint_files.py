"""A checkpoint's files and why they can be trusted.

``manifest.json`` lists the sha256 and size of every other file of a checkpoint directory and is
written last: it is the commit point. A directory without it is incomplete (the writer stopped);
one whose files do not match it is corrupt or tampered; the managers verify every file against the
manifest before anything reads it. Shared by the networks' DCP checkpoints and the boosters'; DCP's
own metadata reader is ml_assets.trainer.dcp_metadata, so that a booster's rank does not import
torch.distributed.checkpoint (about a second of every start).
"""

from __future__ import annotations

import hashlib
import json
import time

import fsspec

MANIFEST = "manifest.json"
FORMAT = 1


# --- manifest --------------------------------------------------------------------------------

def fs_and_path(uri: str):
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path.rstrip("/")


def _sha256_file(fs, path: str) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def write_manifest(directory: str, info: dict) -> dict:
    """Hash every file under ``directory`` and write manifest.json last: the commit point."""
    fs, path = fs_and_path(directory)
    fs.invalidate_cache()
    files = {}
    for full in sorted(fs.find(path)):
        rel = full[len(path) + 1:]
        if rel == MANIFEST:
            continue
        sha, size = _sha256_file(fs, full)
        files[rel] = {"sha256": sha, "bytes": size}
    manifest = {"format": FORMAT, **info, "files": files, "written_at": time.time()}
    with fs.open(f"{path}/{MANIFEST}", "wb") as fh:
        fh.write(json.dumps(manifest, indent=1, sort_keys=True).encode())
    return manifest


def verify(directory: str) -> tuple[dict | None, str]:
    """(manifest, "") when every listed file exists with its sha256 and nothing unlisted was added;
    (None, reason) otherwise. No manifest: reason starts with "incomplete"."""
    fs, path = fs_and_path(directory)
    fs.invalidate_cache()
    try:
        with fs.open(f"{path}/{MANIFEST}", "rb") as fh:
            manifest = json.loads(fh.read())
    except FileNotFoundError:
        return None, "incomplete: no manifest.json (the writer stopped before finishing)"
    except (OSError, ValueError) as exc:
        return None, f"manifest.json unreadable: {exc}"
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        return None, f"manifest.json has format {manifest.get('format')!r}, expected {FORMAT}"
    present = {full[len(path) + 1:] for full in fs.find(path)} - {MANIFEST}
    if extra := sorted(present - set(manifest["files"])):
        return None, f"files not in the manifest: {extra}"
    for rel, want in sorted(manifest["files"].items()):
        if rel not in present:
            return None, f"{rel} is missing"
        sha, size = _sha256_file(fs, f"{path}/{rel}")
        if size != want["bytes"] or sha != want["sha256"]:
            return None, f"{rel} has {size} bytes, sha256 {sha[:12]}; the manifest says {want['bytes']} bytes, sha256 {want['sha256'][:12]}"
    return manifest, ""


# --- numbered checkpoint directories: listing, pruning, the newest that verifies ---------------


class CheckpointError(RuntimeError):
    """No usable checkpoint where one should be (every complete checkpoint failed verification)."""


def numbered(root: str, prefix: str) -> list[tuple[int, str]]:
    """``(number, directory)`` of every ``<prefix><digits>`` directory under ``root``, oldest first."""
    fs, path = fs_and_path(root)
    fs.invalidate_cache()
    if not fs.exists(path):
        return []
    found = []
    for entry in fs.ls(path, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            found.append((int(name[len(prefix):]), f"{root}/{name}"))
    return sorted(found)


def prune(root: str, prefix: str, keep_last: int) -> None:
    """Keep the newest ``keep_last`` complete checkpoints; older ones go, and so do incomplete ones
    older than the newest kept (a newer incomplete one may be a write in progress)."""
    fs, _ = fs_and_path(root)
    entries = numbered(root, prefix)
    complete = [n for n, d in entries if fs.exists(f"{fs_and_path(d)[1]}/{MANIFEST}")]
    keep = set(complete[-keep_last:])
    newest = max(keep, default=-1)
    for n, d in entries:
        if n not in keep and n < newest:
            fs.rm(fs_and_path(d)[1], recursive=True)


def newest_verified(root: str, prefix: str, fingerprint: str, log, warn) -> tuple[int, str, dict] | None:
    """``(number, directory, manifest)`` of the newest checkpoint that verifies and was written for
    ``fingerprint``; incomplete ones are skipped quietly, bad ones with a warning. When none is left
    but some were rejected, CheckpointError: a training never starts over silently."""
    rejected = []
    for number, directory in reversed(numbered(root, prefix)):
        manifest, reason = verify(directory)
        if manifest is None and reason.startswith("incomplete"):
            log(f"checkpoint {directory} is {reason}; ignored")
            continue
        if manifest is not None and manifest.get("fingerprint") != fingerprint:
            reason = (f"written for training config {str(manifest.get('fingerprint'))[:12]}, this run's is "
                      f"{fingerprint[:12]}")
            manifest = None
        if manifest is None:
            warn(f"checkpoint {directory} is unusable ({reason}); trying the previous one")
            rejected.append(f"{directory}: {reason}")
            continue
        return number, directory, manifest
    if rejected:
        raise CheckpointError(
            f"every checkpoint under {root} failed verification, refusing to start over silently "
            f"(delete them to train from scratch): " + "; ".join(rejected))
    return None
