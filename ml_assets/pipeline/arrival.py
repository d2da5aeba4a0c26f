"""Data-arrival sensors: a ``files`` source whose rows path names the day (``{date}``) is listed each
tick, its files grouped by day, and each day's set of files (names, sizes, versions) signed; a day
whose signature has not been ingested yet gets one ingest run. The run key is the day and its
signature, so Dagster launches a file set once, and a file added or replaced later (a new signature)
launches the day again.

Local paths are globbed; ``s3://`` is listed with dagster-aws (``dagster_aws.s3.sensor.get_objects``
through an ``S3Resource`` client, the spec's ``storage_options`` giving the endpoint and region,
credentials from the environment).
"""

from __future__ import annotations

import datetime as dt
import glob
import hashlib
import json
import os
import re
from dataclasses import dataclass

import dagster as dg

from ml_assets.pipeline.graph import ModelGraph
from ml_assets.spec import ModelSpec

MAX_RUNS_PER_TICK = 20
"""Days launched per tick: a first tick over a year of files starts 20 days, the next tick 20 more."""
DAY = r"(?P<day>\d{4}-\d{2}-\d{2})"
ARRIVAL_TAG = "ml_assets/arrival"
"""A run launched for a day's files: ``<day>:<the first 16 hex digits of its file set's signature>``."""


@dataclass(frozen=True)
class SeenFile:
    url: str
    size: int
    version: str
    """What changes when the file is replaced: the S3 ETag, or the local mtime in ns."""


def watched(spec: ModelSpec) -> bool:
    """Whether a data-arrival sensor can tell the days apart: files whose rows path holds ``{date}``."""
    return spec.source.kind == "files" and "{date}" in (spec.source.rows.path or "")


def day_regex(template: str) -> re.Pattern[str]:
    """The template as a regular expression over a file's URL, the day captured."""
    out = []
    for part in re.split(r"(\{date\}|\*\*|\*|\?)", template):
        out.append({"{date}": DAY, "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part)))
    return re.compile("".join(out) + "$")


def list_files(spec: ModelSpec) -> list[SeenFile]:
    template = spec.source.rows.path or ""
    pattern = template.replace("{date}", "*")
    if template.startswith("s3://"):
        return _s3_files(pattern, spec.source.storage_options)
    return [SeenFile(path, (st := os.stat(path)).st_size, str(st.st_mtime_ns))
            for path in sorted(glob.glob(pattern, recursive=True)) if os.path.isfile(path)]


def _s3_files(pattern: str, options: dict[str, str]) -> list[SeenFile]:
    from dagster_aws.s3 import S3Resource
    from dagster_aws.s3.sensor import get_objects

    bucket, _, key_pattern = pattern.removeprefix("s3://").partition("/")
    prefix = re.split(r"[*?\[]", key_pattern, maxsplit=1)[0]  # listed from the last fixed part on
    client = S3Resource(endpoint_url=options.get("endpoint_url"), region_name=options.get("region_name")).get_client()
    return [SeenFile(f"s3://{bucket}/{obj['Key']}", int(obj.get("Size", 0)), str(obj.get("ETag", "")))
            for obj in get_objects(bucket, prefix, client=client)]


def file_sets(spec: ModelSpec, files: list[SeenFile]) -> dict[str, tuple[str, int]]:
    """Each day with files: (the signature of its file set, how many files), within the spec's partitions."""
    regex = day_regex(spec.source.rows.path or "")
    by_day: dict[str, list[SeenFile]] = {}
    for seen in files:
        match = regex.match(seen.url)
        if match is None:
            continue
        try:
            day = dt.date.fromisoformat(match["day"])
        except ValueError:  # 2013-02-30 in a file name is not a day
            continue
        part = spec.partitioning
        if day < part.start or (part.end is not None and day > part.end):
            continue
        by_day.setdefault(day.isoformat(), []).append(seen)
    signed = {}
    for day, seen in by_day.items():
        digest = hashlib.sha256()
        for f in sorted(seen, key=lambda f: f.url):
            digest.update(f"{f.url}\0{f.size}\0{f.version}\n".encode())
        signed[day] = (digest.hexdigest(), len(seen))
    return signed


def build_arrival_sensor(spec: ModelSpec, ingest_job: dg.JobDefinition) -> dg.SensorDefinition:
    @dg.sensor(
        name=ModelGraph(spec).arrival_sensor, job=ingest_job, minimum_interval_seconds=300,
        # Stopped by default, like the schedules: ingesting on arrival is turned on, not deployed on.
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(f"Ingests a day of {spec.name} when its files appear under {spec.source.rows.path} (or change): "
                     "one run per day and set of files."),
    )
    def data_arrival_sensor(context: dg.SensorEvaluationContext):
        # The cursor holds each day's last launched signature, so a tick skips what it launched
        # before (the run key would deduplicate it too, but would still count against the tick's cap).
        launched: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
        requests = []
        for day, (signature, count) in sorted(file_sets(spec, list_files(spec)).items()):
            if launched.get(day) == signature:
                continue
            requests.append(dg.RunRequest(
                run_key=f"{day}:{signature[:16]}", partition_key=day,
                tags={ARRIVAL_TAG: f"{day}:{signature[:16]}", "ml_assets/arrival_files": str(count)}))
            launched[day] = signature
            if len(requests) == MAX_RUNS_PER_TICK:
                break
        if not requests:
            return dg.SkipReason(f"no new files under {spec.source.rows.path}")
        context.update_cursor(json.dumps(launched, sort_keys=True))
        context.log.info(f"new files for {', '.join(r.partition_key for r in requests)}")
        return requests

    return data_arrival_sensor


