"""Branching copies nothing and commits cost what changed, not what the repository holds.

    python -m benchmarks.version_store [--quick]

Measures, in the embedded version store, (1) creating a branch in a repository of 10,000 objects
against one of 10 objects, and (2) committing 10 changed objects in each. Medians of several runs;
the ratios are the results (goals: branch <= 1.5, commit <= 2).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid

from ml_assets.versioning import LocalVersionStore


def _repository(store: LocalVersionStore, repo: str, objects: int) -> None:
    store.ensure_repository(repo)
    store.create_branch(repo, "load")
    batch = 2_000
    for start in range(0, objects, batch):
        store.put_objects(repo, "load", {f"rows/date={i:06d}/part-0.parquet": f"object {i}".encode()
                                         for i in range(start, min(objects, start + batch))})
    store.commit(repo, "load", f"{objects} objects", {})
    store.merge(repo, "load")


def _time_branch(store: LocalVersionStore, repo: str, runs: int) -> float:
    samples = []
    for _ in range(runs):
        name = f"b-{uuid.uuid4().hex[:10]}"
        started = time.perf_counter()
        store.create_branch(repo, name, "main")
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def _time_commit(store: LocalVersionStore, repo: str, objects: int, runs: int, changes: int = 10) -> float:
    samples = []
    step = max(1, objects // changes)
    for run in range(runs):
        name = f"c-{uuid.uuid4().hex[:10]}"
        store.create_branch(repo, name, "main")
        # 10 objects spread over the repository (worst case: each in its own range).
        store.put_objects(repo, name, {f"rows/date={i:06d}/part-0.parquet": f"changed {run} {i}".encode()
                                       for i in range(0, step * changes, step)})
        started = time.perf_counter()
        store.commit(repo, name, "10 changed objects", {})
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2,000 objects and fewer runs (a smoke run)")
    args = parser.parse_args()
    large, runs = (2_000, 5) if args.quick else (10_000, 15)
    with tempfile.TemporaryDirectory(prefix="bench-version-store-") as tmp:
        store = LocalVersionStore(tmp)
        _repository(store, "small-repo", 10)
        _repository(store, "large-repo", large)
        # Interleave nothing else: both repositories share the store, so caches and disk are alike.
        branch_small, branch_large = _time_branch(store, "small-repo", runs), _time_branch(store, "large-repo", runs)
        commit_small = _time_commit(store, "small-repo", 10, runs)
        commit_large = _time_commit(store, "large-repo", large, runs)
        # Past the overlay limit a commit folds the overlay into ranges: the occasional slow commit.
        compact = store.overlay_limit + 1
        compact_small = _time_commit(store, "small-repo", 10, runs, changes=10)
        compact_large = _time_commit(store, "large-repo", large, runs, changes=compact)
    print(f"create branch: 10 objects {branch_small * 1e3:.2f} ms, {large} objects {branch_large * 1e3:.2f} ms (medians of {runs})")
    print(f"commit 10 changes: 10 objects {commit_small * 1e3:.2f} ms, {large} objects {commit_large * 1e3:.2f} ms (medians of {runs})")
    print(f"a commit that compacts ({compact} changes spread over {large} objects): {compact_large * 1e3:.2f} ms "
          f"vs {compact_small * 1e3:.2f} ms for 10 in 10; it happens once every {store.overlay_limit} changed paths")
    print(f"RESULT version_store_branch_ratio {branch_large / branch_small:.3f} goal <= 1.5")
    print(f"RESULT version_store_commit_ratio {commit_large / commit_small:.3f} goal <= 2")


if __name__ == "__main__":
    main()
