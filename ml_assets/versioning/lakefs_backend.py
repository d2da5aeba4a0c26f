"""The lakeFS backend: the same VersionStore behaviour through the official ``lakefs`` Python SDK.

Objects are uploaded directly (no presigned URLs) with their sha256 as lakeFS user metadata
(``x-lakefs-meta-sha256``): lakeFS's own checksum is the storage ETag, and the platform pins bytes
by sha256. Reads verify it. ``main`` is protected twice: this client refuses writes and commits to
the default branch, and ``ensure_repository`` adds a lakeFS branch-protection rule for it, so other
clients are refused by the server too.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from ml_assets.names import check_branch_name, check_object_path, check_repo_name
from ml_assets.versioning.base import (
    Change,
    Commit,
    MergeConflict,
    NoChanges,
    NotFound,
    ObjectInfo,
    ProtectedBranch,
    StoreBusy,
    VersionStoreError,
)

SHA_KEY = "sha256"
T = TypeVar("T")


class _Conflict(VersionStoreError):
    pass


class _BadRequest(VersionStoreError):
    pass


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """Exceptions of the lakeFS wrapper (``lakefs.exceptions``) and of the generated SDK
    (``lakefs_sdk.ApiException``) -> the VersionStore errors every backend raises."""
    import lakefs_sdk
    from lakefs import exceptions as lx

    try:
        yield
    except (lx.ServerException, lakefs_sdk.ApiException) as exc:
        status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
        reason = _reason(exc)
        if status == 404:
            raise NotFound(f"{what}: not found ({reason})") from None
        if status == 403:
            raise ProtectedBranch(f"{what}: refused by lakeFS ({reason})") from None
        if status == 409:
            raise _Conflict(f"{what}: conflict ({reason})") from None
        if status == 400:
            if "no changes" in reason.lower():
                raise NoChanges(f"{what}: no changes") from None
            raise _BadRequest(f"{what}: {reason}") from None
        if status in (429, 503):
            raise StoreBusy(f"{what}: lakeFS is busy ({reason})") from None
        raise VersionStoreError(f"{what}: lakeFS answered {status} ({reason})") from None


def _reason(exc: Exception) -> str:
    import json

    body = getattr(exc, "body", None)
    if isinstance(body, str | bytes):
        try:
            body = json.loads(body)
        except ValueError:
            return str(body)
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(getattr(exc, "reason", "") or exc)


def _commit(repo: str, c) -> Commit:
    created = dt.datetime.fromtimestamp(c.creation_date, dt.UTC).isoformat(timespec="microseconds")
    return Commit(c.id, repo, tuple(c.parents or ()), c.message, dict(c.metadata or {}), created)


class LakeFSVersionStore:
    def __init__(self, endpoint: str, access_key_id: str, secret_access_key: str, storage_namespace: str,
                 default_branch: str = "main") -> None:
        import lakefs

        self._lakefs = lakefs
        self.client = lakefs.Client(host=endpoint, username=access_key_id, password=secret_access_key)
        self.storage_namespace = storage_namespace.rstrip("/")
        self.default_branch = default_branch

    def _repo(self, repo: str):
        check_repo_name(repo)
        return self._lakefs.Repository(repo, client=self.client)

    def _ref(self, repo: str, ref: str):
        return self._lakefs.Reference(self._repo(repo).id, ref, client=self.client)

    def _writable(self, repo: str, branch: str):
        check_branch_name(branch)
        if branch == self.default_branch:
            raise ProtectedBranch(f"branch {branch!r} of repository {repo!r} is protected: write on a branch and merge")
        return self._repo(repo).branch(branch)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        with _errors(what):
            return fn()

    # -- repositories and branches ----------------------------------------------------------------

    def ensure_repository(self, repo: str) -> None:
        from lakefs_sdk import BranchProtectionRule

        handle = self._repo(repo)
        self._call(f"create repository {repo!r}", lambda: handle.create(
            storage_namespace=f"{self.storage_namespace}/{repo}", default_branch=self.default_branch, exist_ok=True))
        api = self.client.sdk_client.repositories_api
        rules = self._call(f"branch protection of {repo!r}", lambda: api.get_branch_protection_rules(repo))
        if not any(rule.pattern == self.default_branch for rule in rules):
            self._call(f"protect {self.default_branch!r} of {repo!r}", lambda: api.set_branch_protection_rules(
                repo, [*rules, BranchProtectionRule(pattern=self.default_branch)]))

    def create_branch(self, repo: str, branch: str, source_ref: str = "main") -> str:
        check_branch_name(branch)
        handle = self._repo(repo).branch(branch)
        try:
            self._call(f"create branch {branch!r} in {repo!r} from {source_ref!r}", lambda: handle.create(source_ref))
        except _Conflict:
            raise VersionStoreError(f"branch {branch!r} already exists in repository {repo!r}") from None
        return self.branch_head(repo, branch)

    def branch_head(self, repo: str, branch: str) -> str:
        check_branch_name(branch)
        return self._call(f"branch {branch!r} of {repo!r}", lambda: self._repo(repo).branch(branch).head.id)

    def list_branches(self, repo: str) -> dict[str, str]:
        branches = self._call(f"branches of {repo!r}", lambda: list(self._repo(repo).branches()))
        return {b.id: self.branch_head(repo, b.id) for b in branches}

    def delete_branch(self, repo: str, branch: str) -> None:
        handle = self._writable(repo, branch)
        self._call(f"delete branch {branch!r} of {repo!r}", handle.delete)

    # -- objects ------------------------------------------------------------------------------------

    def put_object(self, repo: str, branch: str, path: str, data: bytes) -> ObjectInfo:
        check_object_path(path)
        handle = self._writable(repo, branch)
        sha = hashlib.sha256(data).hexdigest()
        self._call(f"upload {path!r} to {repo!r}@{branch}", lambda: handle.object(path).upload(
            data, mode="wb", pre_sign=False, metadata={SHA_KEY: sha}))
        return ObjectInfo(path, sha, len(data))

    def put_objects(self, repo: str, branch: str, objects: dict[str, bytes]) -> list[ObjectInfo]:
        return [self.put_object(repo, branch, path, data) for path, data in objects.items()]

    def delete_object(self, repo: str, branch: str, path: str) -> None:
        check_object_path(path)
        handle = self._writable(repo, branch)
        self._call(f"delete {path!r} on {repo!r}@{branch}", lambda: handle.object(path).delete())

    def stat_object(self, repo: str, ref: str, path: str) -> ObjectInfo:
        check_object_path(path)
        try:
            stat = self._call(f"object {path!r} at {ref!r} in {repo!r}", lambda: self._ref(repo, ref).object(path).stat())
        except NotFound:
            # lakeFS's 404 on objects carries no body: say whether the ref or the object is missing.
            self._call(f"ref {ref!r} (branch, tag or commit id) in repository {repo!r}",
                       lambda: self._repo(repo).commit(ref).get_commit())
            raise NotFound(f"object {path!r} does not exist at {ref!r} in repository {repo!r}") from None
        sha = (stat.metadata or {}).get(SHA_KEY)
        if not sha:
            raise VersionStoreError(f"object {path!r} at {ref!r} in {repo!r} has no sha256 metadata: "
                                    "it was not written by ml_assets")
        return ObjectInfo(path, sha, int(stat.size_bytes or 0))

    def get_object(self, repo: str, ref: str, path: str) -> bytes:
        info = self.stat_object(repo, ref, path)
        data = self._call(f"read {path!r} at {ref!r} in {repo!r}",
                          lambda: self._ref(repo, ref).object(path).reader(mode="rb", pre_sign=False).read())
        if hashlib.sha256(data).hexdigest() != info.sha256:
            raise VersionStoreError(f"object {path!r} at {ref!r} in {repo!r} is corrupt: sha256 does not match {info.sha256}")
        return data

    def list_objects(self, repo: str, ref: str, prefix: str = "") -> list[ObjectInfo]:
        listed = self._call(f"objects at {ref!r} in {repo!r}", lambda: list(
            self._ref(repo, ref).objects(prefix=prefix or None, user_metadata=True)))
        return [ObjectInfo(o.path, (o.metadata or {}).get(SHA_KEY, ""), int(o.size_bytes or 0))
                for o in listed if isinstance(o, self._lakefs.models.ObjectInfo)]  # not common prefixes

    # -- commits, merges, history -------------------------------------------------------------------

    def commit(self, repo: str, branch: str, message: str, metadata: dict[str, str]) -> Commit:
        handle = self._writable(repo, branch)
        ref = self._call(f"commit on {repo!r}@{branch}", lambda: handle.commit(message, metadata=dict(metadata)))
        return self.get_commit(repo, ref.id)

    def merge(self, repo: str, source: str, dest: str = "main", metadata: dict[str, str] | None = None,
              fast_forward: bool = False) -> str:
        """lakeFS always makes a merge commit; ``fast_forward`` is accepted for the interface's sake."""
        check_branch_name(dest)
        try:
            return self._call(f"merge {source!r} into {dest!r} in {repo!r}", lambda: self._ref(repo, source).merge_into(
                self._repo(repo).branch(dest), message=f"Merge {source!r} into {dest!r}", metadata=dict(metadata or {})))
        except _Conflict:
            raise MergeConflict(repo, source, dest, self._conflicting_paths(repo, source, dest)) from None
        except NoChanges:  # nothing to merge: dest already holds it
            return self.branch_head(repo, dest)

    def _conflicting_paths(self, repo: str, source: str, dest: str) -> list[str]:
        """lakeFS answers a conflict with a bare 409: name the paths both sides changed differently."""
        api = self.client.sdk_client.refs_api
        base = self._call(f"merge base of {source!r} and {dest!r}", lambda: api.find_merge_base(repo, source, dest))
        ours = {c.path: c.sha256 for c in self.diff(repo, base.base_commit_id, dest)}
        theirs = {c.path: c.sha256 for c in self.diff(repo, base.base_commit_id, source)}
        return sorted(p for p in ours.keys() & theirs.keys() if ours[p] != theirs[p]) or ["(unknown paths)"]

    def revert(self, repo: str, branch: str, ref: str, parent_number: int = 1,
               metadata: dict[str, str] | None = None) -> Commit:
        from lakefs_sdk import CommitOverrides, RevertCreation

        self._writable(repo, branch)
        target = self.get_commit(repo, ref)
        if not 1 <= parent_number <= len(target.parents):
            raise VersionStoreError(f"commit {target.id[:12]} has {len(target.parents)} parent(s); "
                                    f"parent {parent_number} does not exist")
        body = RevertCreation(ref=target.id, parent_number=parent_number if len(target.parents) > 1 else 0,
                              commit_overrides=CommitOverrides(message=f"Revert {target.id}", metadata=dict(metadata or {})))
        api = self.client.sdk_client.branches_api
        try:
            self._call(f"revert {target.id[:12]} on {repo!r}@{branch}", lambda: api.revert_branch(repo, branch, body))
        except _Conflict:
            raise MergeConflict(repo, f"revert of {target.id[:12]}", branch, ["(lakeFS does not name the paths)"]) from None
        return self.get_commit(repo, branch)

    def get_commit(self, repo: str, ref: str) -> Commit:
        found = self._call(f"commit {ref!r} of {repo!r}", lambda: self._repo(repo).commit(ref).get_commit())
        return _commit(repo, found)

    def log(self, repo: str, ref: str = "main", limit: int | None = None) -> list[Commit]:
        found = self._call(f"log of {ref!r} in {repo!r}", lambda: list(self._ref(repo, ref).log(max_amount=limit)))
        return [_commit(repo, c) for c in found]

    def diff(self, repo: str, left_ref: str, right_ref: str, prefix: str = "") -> list[Change]:
        changes = self._call(f"diff {left_ref!r}..{right_ref!r} in {repo!r}",
                             lambda: list(self._ref(repo, left_ref).diff(self._ref(repo, right_ref), prefix=prefix or None)))
        out = []
        for change in sorted(changes, key=lambda c: c.path):
            side = left_ref if change.type == "removed" else right_ref
            info = self.stat_object(repo, side, change.path)
            out.append(Change(change.path, change.type, info.sha256, info.size))
        return out

    # -- tags ---------------------------------------------------------------------------------------

    def create_tag(self, repo: str, tag: str, ref: str) -> str:
        check_branch_name(tag)
        try:
            self._call(f"create tag {tag!r} in {repo!r}", lambda: self._repo(repo).tag(tag).create(ref))
        except _Conflict:
            raise VersionStoreError(f"tag {tag!r} already exists in repository {repo!r}") from None
        return self.get_commit(repo, tag).id

    def list_tags(self, repo: str) -> dict[str, str]:
        tags = self._call(f"tags of {repo!r}", lambda: list(self._repo(repo).tags()))
        return {t.id: self.get_commit(repo, t.id).id for t in tags}

    def delete_tag(self, repo: str, tag: str) -> None:
        self._call(f"delete tag {tag!r} of {repo!r}", lambda: self._repo(repo).tag(tag).delete())

