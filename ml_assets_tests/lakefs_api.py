"""An HTTP server whose requests and responses are shaped like the lakeFS API (v1), for tests.

No lakeFS server can run on the development and CI machines. This server lets the real ``lakefs``
SDK and our lakeFS backend be exercised over HTTP: it implements the endpoints the backend calls,
with the status codes, JSON shapes and errors lakeFS uses, on top of the embedded version store
(so its branching, merge and protection semantics are those of the conformance suite). It is a
stand-in for a lakeFS *server*, not for the code under test. Against a real lakeFS, set
LAKEFS_ENDPOINT, LAKEFS_ACCESS_KEY_ID and LAKEFS_SECRET_ACCESS_KEY and the suite uses it instead.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ml_assets.names import InvalidName
from ml_assets.versioning import (
    LocalVersionStore,
    MergeConflict,
    NoChanges,
    NotFound,
    ProtectedBranch,
    VersionStoreError,
)

CONFIG = {
    "version_config": {"version": "1.70.0-ml-assets-test"},
    "storage_config": {
        "blockstore_type": "local", "blockstore_namespace_example": "local://example",
        "blockstore_namespace_ValidityRegex": "^local://", "pre_sign_support": False,
        "pre_sign_support_ui": False, "import_support": False, "import_validity_regex": "^local://",
    },
}


def _epoch(iso: str) -> int:
    return int(dt.datetime.fromisoformat(iso).timestamp())


def _page(results: list) -> dict:
    return {"pagination": {"has_more": False, "next_offset": "", "results": len(results), "max_per_page": 1000},
            "results": results}


class LakeFSLikeServer:
    def __init__(self, root: Path) -> None:
        self.store = LocalVersionStore(root)
        self.namespaces: dict[str, str] = {}
        self.protection: dict[str, list[dict]] = {}
        self.user_metadata: dict[str, dict[str, str]] = {}  # sha256 -> x-lakefs-meta-* of its upload
        self.requests: list[str] = []
        self._lock = threading.Lock()  # one request at a time: the store has one connection per thread
        server = self
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"app": server}))
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> LakeFSLikeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- shapes ---------------------------------------------------------------------------------

    def repository(self, repo: str) -> dict:
        self.store.list_branches(repo)  # 404 when it does not exist
        return {"id": repo, "creation_date": 0, "default_branch": "main", "storage_namespace": self.namespaces[repo]}

    def commit_json(self, repo: str, ref: str) -> dict:
        c = self.store.get_commit(repo, ref)
        return {"id": c.id, "parents": list(c.parents), "committer": "ml_assets", "message": c.message,
                "creation_date": _epoch(c.created_at), "meta_range_id": "", "metadata": c.metadata}

    def object_stats(self, path: str, sha: str, size: int) -> dict:
        return {"path": path, "path_type": "object", "physical_address": f"local://objects/{sha}", "checksum": sha,
                "size_bytes": size, "mtime": 0, "metadata": self.user_metadata.get(sha, {})}

    def protected(self, repo: str, branch: str) -> bool:
        return any(re.fullmatch(rule["pattern"].replace("*", ".*"), branch) for rule in self.protection.get(repo, []))


class _Handler(BaseHTTPRequestHandler):
    app: LakeFSLikeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            # The SDK streams uploads chunked; http.server does not de-chunk for us.
            data = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: object = None, raw: bytes | None = None, content_type: str = "application/json") -> None:
        payload = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _handle(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = [unquote(p) for p in url.path.removeprefix("/api/v1").strip("/").split("/")]
        raw = self._body()
        body = json.loads(raw) if raw and self.headers.get("Content-Type", "").startswith("application/json") else {}
        self.app.requests.append(f"{self.command} {url.path}")
        with self.app._lock:
            try:
                self._route(parts, query, body, raw)
            except NotFound as exc:
                self._send(404, {"message": str(exc)})
            except ProtectedBranch as exc:
                self._send(403, {"message": str(exc)})
            except MergeConflict as exc:
                self._send(409, {"message": str(exc)})
            except NoChanges as exc:
                self._send(400, {"message": f"no changes: {exc}"})
            except InvalidName as exc:
                self._send(400, {"message": str(exc)})
            except VersionStoreError as exc:
                status = 409 if "already exists" in str(exc) else 400
                self._send(status, {"message": str(exc)})

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

    def _route(self, p: list[str], q: dict, body: dict, raw: bytes) -> None:  # noqa: C901 - a router
        app, store, m = self.app, self.app.store, self.command
        if p == ["config"]:
            return self._send(200, CONFIG)
        if p == ["repositories"] and m == "POST":
            repo = body["name"]
            if repo in app.namespaces:
                return self._send(409, {"message": f"repository {repo} already exists"})
            store.ensure_repository(repo, body.get("default_branch", "main"))
            app.namespaces[repo] = body["storage_namespace"]
            return self._send(201, app.repository(repo))
        if len(p) < 2 or p[0] != "repositories":
            return self._send(404, {"message": f"no route {m} {self.path}"})
        repo, rest = p[1], p[2:]
        if repo not in app.namespaces:
            return self._send(404, {"message": f"repository {repo} not found"})
        if not rest and m == "GET":
            return self._send(200, app.repository(repo))
        if rest == ["settings", "branch_protection"]:
            if m == "GET":
                return self._send(200, app.protection.get(repo, []))
            app.protection[repo] = body if isinstance(body, list) else json.loads(raw)
            return self._send(204)
        if rest == ["branches"] and m == "POST":
            store.create_branch(repo, body["name"], body["source"])
            return self._send(201, raw=store.branch_head(repo, body["name"]).encode(), content_type="text/plain")
        if rest == ["branches"] and m == "GET":
            return self._send(200, _page([{"id": n, "commit_id": c} for n, c in store.list_branches(repo).items()]))
        if rest[:1] == ["branches"] and len(rest) >= 2:
            branch, tail = rest[1], rest[2:]
            if m in ("POST", "DELETE", "PUT") and app.protected(repo, branch):
                return self._send(403, {"message": f"cannot write to protected branch {branch}"})
            if not tail and m == "GET":
                return self._send(200, {"id": branch, "commit_id": store.branch_head(repo, branch)})
            if not tail and m == "DELETE":
                store.delete_branch(repo, branch)
                return self._send(204)
            if tail == ["objects"] and m == "POST":
                info = store.put_object(repo, branch, q["path"], raw)
                meta = {k[len("x-lakefs-meta-"):]: v for k, v in self.headers.items() if k.lower().startswith("x-lakefs-meta-")}
                app.user_metadata[info.sha256] = meta
                return self._send(201, app.object_stats(info.path, info.sha256, info.size))
            if tail == ["objects"] and m == "DELETE":
                store.delete_object(repo, branch, q["path"])
                return self._send(204)
            if tail == ["commits"] and m == "POST":
                commit = store.commit(repo, branch, body["message"], body.get("metadata") or {})
                return self._send(201, app.commit_json(repo, commit.id))
            if tail == ["revert"] and m == "POST":
                overrides = body.get("commit_overrides") or {}
                store.revert(repo, branch, body["ref"], max(1, body.get("parent_number", 0)), overrides.get("metadata"))
                return self._send(204)
        if rest[:1] == ["commits"] and len(rest) == 2 and m == "GET":
            return self._send(200, app.commit_json(repo, rest[1]))
        if rest[:1] == ["refs"] and len(rest) >= 3:
            ref, tail = rest[1], rest[2:]
            if tail[0] == "merge" and m == "GET":  # find_merge_base
                src, dst = store.get_commit(repo, ref).id, store.branch_head(repo, tail[1])
                src_history = {c.id for c in store.log(repo, src)}
                base = next(c.id for c in store.log(repo, dst) if c.id in src_history)
                return self._send(200, {"source_commit_id": src, "destination_commit_id": dst, "base_commit_id": base})
            if tail[0] == "merge" and m == "POST":
                dest = tail[1]  # merges are how protected branches change: allowed
                before = store.branch_head(repo, dest)
                head = store.merge(repo, ref, dest, metadata=body.get("metadata") or {})
                if head == before:
                    return self._send(400, {"message": "no changes"})
                return self._send(200, {"reference": head})
            if tail[0] == "diff" and m == "GET":
                changes = store.diff(repo, ref, tail[1], q.get("prefix", ""))
                return self._send(200, _page([{"type": c.type, "path": c.path, "path_type": "object",
                                                "size_bytes": c.size} for c in changes]))
            if tail == ["commits"] and m == "GET":
                commits = store.log(repo, ref, int(q["amount"]) if "amount" in q else None)
                return self._send(200, _page([app.commit_json(repo, c.id) for c in commits]))
            if tail == ["objects"] and m in ("GET", "HEAD"):
                data = store.get_object(repo, ref, q["path"])
                return self._send(200, raw=data, content_type="application/octet-stream")
            if tail == ["objects", "stat"]:
                info = store.stat_object(repo, ref, q["path"])
                return self._send(200, app.object_stats(info.path, info.sha256, info.size))
            if tail == ["objects", "ls"]:
                objects = store.list_objects(repo, ref, q.get("prefix", ""))
                return self._send(200, _page([app.object_stats(o.path, o.sha256, o.size) for o in objects]))
        if rest == ["tags"] and m == "POST":
            store.create_tag(repo, body["id"], body["ref"])
            return self._send(201, {"id": body["id"], "commit_id": store.get_commit(repo, body["id"]).id})
        if rest == ["tags"] and m == "GET":
            return self._send(200, _page([{"id": t, "commit_id": c} for t, c in store.list_tags(repo).items()]))
        if rest[:1] == ["tags"] and len(rest) == 2 and m == "DELETE":
            store.delete_tag(repo, rest[1])
            return self._send(204)
        return self._send(404, {"message": f"no route {m} {self.path}"})
