"""A model's scheduled verification: a job whose one step checks the model's stores, and a daily
schedule for it, stopped until someone turns it on (the check reads every byte: on a long history it
is an hour's reading, not a sensor's tick).

A store found whole is a green run whose metadata counts what was read. A problem fails the run with
the problems as its reason, so the production instance's failure alerts post them to the alert
webhook (ml_assets.deploy.alerts) like any failed run: a store that lost bytes is a real break, and
stays loud until `ml-assets verify --repair` (or a person) mends it. The job only reads; repairing is
a person's decision, on the command line."""


import dagster as dg

from ml_assets.resources import MlflowTrackingResource
from ml_assets.resources.version_store import VersionStoreResource
from ml_assets.spec import ModelSpec

HOUR = 5
"""Local time of the model's timezone: after the night's daily runs, before people look."""


def build_verify_job(spec: ModelSpec, tags: dict[str, str]) -> dg.JobDefinition:
    """``tags``: the model's run tags (its team and priority, for the queue)."""
    @dg.op(name=f"{spec.name}_verify_stores", tags={"kind": "verify"})
    def verify_stores(context: dg.OpExecutionContext, version_store: VersionStoreResource,
                      tracking: MlflowTrackingResource) -> dg.Output[None]:
        from ml_assets.verification.check import check

        report = check(tracking.client(), version_store.get_store(), spec.name)
        for finding in report.findings:
            context.log.error(finding.line())
        for note in report.notes:
            context.log.warning(note.line())
        if not report.whole:
            shown = "; ".join(f.line() for f in report.findings[:5])
            more = f"; and {len(report.findings) - 5} more" if len(report.findings) > 5 else ""
            raise dg.Failure(description=f"{report.summary()}: {shown}{more} "
                             f"(`ml-assets verify {spec.name} --repair` rebuilds what it can)",
                             metadata={"report": dg.MetadataValue.json(report.as_dict())})
        return dg.Output(None, metadata={"commits": report.commits, "objects": report.objects,
                                         "versions": len(report.loadable), "aliases": dict(report.aliases),
                                         "notes": [n.line() for n in report.notes]})

    @dg.job(name=f"{spec.name}_verify", tags=tags,
            description=f"Check that every object of {spec.name}'s main history, every registered version and "
                        "every alias is whole (reads only; `ml-assets verify --repair` repairs).")
    def verify_job() -> None:
        verify_stores()

    return verify_job


def build_verify_schedule(spec: ModelSpec, job: dg.JobDefinition) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(name=f"{job.name}_schedule", job=job, cron_schedule=f"0 {HOUR} * * *",
                                 execution_timezone=spec.partitioning.timezone,
                                 default_status=dg.DefaultScheduleStatus.STOPPED,
                                 description=f"{job.name} at {HOUR:02d}:00 each day; failures reach the alert webhook.")
