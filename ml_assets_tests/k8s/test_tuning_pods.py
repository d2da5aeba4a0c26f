"""Trial workers as pods (ml_assets.tuning.k8s_job): the worker Job validates, and through the official
Kubernetes client against the API emulation (ml_assets_tests/k8s/apiserver.py) two worker pods share
a study on the real PostgreSQL until it has its trials; the job file they read holds no password."""

import json
import os

import dagster as dg
import pytest

from ml_assets.deploy.k8s.pods import TrainingDefaults
from ml_assets.tuning import study as st
from ml_assets.tuning.k8s_job import KubernetesTuningResource, tuning_job_manifest
from ml_assets_tests.helpers import model_spec
from ml_assets_tests.k8s.apiserver import FakeApiServer
from ml_assets_tests.k8s.conftest import assert_restricted, validate
from ml_assets_tests.tuning.test_study import job as toy_job

pytestmark = pytest.mark.torchrun

POSTGRES = os.environ.get("ML_ASSETS_TEST_POSTGRES_URL")
STEP_POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "dagster-step-tune01", "namespace": "ml", "uid": "5e1d0c1e-0000-4000-8000-00000000beef"},
    "spec": {"serviceAccountName": "ml-assets", "containers": [{
        "name": "dagster", "image": "registry.example.com/ml-assets:0.1.0",
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        "envFrom": [{"configMapRef": {"name": "ml-assets-env"}}, {"secretRef": {"name": "ml-assets-optuna"}}]}]},
}


def test_the_trial_worker_job_validates_and_sizes_pods_like_training():
    spec = model_spec(tuning=dict(processes_per_trial=2, workers=4))
    defaults = TrainingDefaults(gpus_per_node=8, node_selector={"pool": "a100"})
    job = tuning_job_manifest(spec, defaults, name="flights-delay-tune-0a1b2c3d-0", namespace="ml",
                              image="registry.example.com/ml-assets:0.1.0", job_uri="s3://ml/artifacts/tuning/x/job.json",
                              workers=4)
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert_restricted(pod, "trial worker pod")
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"  # one per torchrun process of a trial
    assert container["command"] + container["args"] == ["python", "-m", "ml_assets.tuning.study",
                                                         "s3://ml/artifacts/tuning/x/job.json"]
    assert pod["nodeSelector"] == {"pool": "a100"} and pod["restartPolicy"] == "OnFailure"


@pytest.mark.skipif(not POSTGRES, reason="set ML_ASSETS_TEST_POSTGRES_URL (.ci/run sets it for the local PostgreSQL)")
def test_two_worker_pods_share_a_postgres_study_and_the_job_file_holds_no_password(tmp_path, monkeypatch):
    (tmp_path / "api").mkdir()
    api = FakeApiServer(tmp_path / "api", STEP_POD, secrets={"ml-assets-optuna": {"ML_ASSETS_OPTUNA_STORAGE": POSTGRES}})
    monkeypatch.setenv("HOSTNAME", STEP_POD["metadata"]["name"])
    try:
        job = toy_job(tmp_path, POSTGRES, spec={"trials": 4, "max_epochs": 2, "pruner": {"kind": "none"}})
        st.open_study(job, create=True)
        store = tmp_path / "objects"
        resource = KubernetesTuningResource(storage_url=POSTGRES, workdir=str(tmp_path / "work"),
                                            job_store_url=f"file://{store}", namespace="ml", poll_seconds=0.2,
                                            kubeconfig_file=api.kubeconfig(tmp_path / "kubeconfig", "ml"))
        codes = {}

        @dg.asset
        def hyperparameters(context: dg.AssetExecutionContext) -> None:
            codes["value"] = resource.run_workers(context, model_spec(), job, 2)

        with dg.instance_for_test() as instance:
            assert dg.materialize([hyperparameters], instance=instance).success
        assert codes["value"] == [0, 0]
        counts = st.counts(st.open_study(job))
        # Workers stop once the study has its trials; one may start a trial while the other finishes
        # the last one, so at most workers - 1 more.
        assert 4 <= counts["complete"] <= 5 and counts["running"] == 0, counts
        # Both pods ran trials: each trial records its worker (pod name and process).
        workers = {t.user_attrs["worker"] for t in st.open_study(job).get_trials()}
        assert {w.split(":")[0].rsplit("-", 1)[0] for w in workers} == {f"{api.created['Job']['metadata']['name']}-0",
                                                                         f"{api.created['Job']['metadata']['name']}-1"}, workers
        written = json.loads((store / "tuning" / job.study_name / "job.json").read_text())
        assert written["storage_url"] == "env:ML_ASSETS_OPTUNA_STORAGE"
        assert POSTGRES not in json.dumps(written)
        manifest = api.created["Job"]
        assert manifest["metadata"]["ownerReferences"][0]["uid"] == STEP_POD["metadata"]["uid"]
        assert manifest["spec"]["template"]["spec"]["containers"][0]["envFrom"] == STEP_POD["spec"]["containers"][0]["envFrom"]
        assert api.jobs == {} and ("Job", manifest["metadata"]["name"]) in api.deleted
        from ml_assets_tests.k8s.test_launcher import _chart_role

        allowed = {(verb, group, resource) for rule in _chart_role()["rules"] for group in rule["apiGroups"]
                   for resource in rule["resources"] for verb in rule["verbs"]}
        assert api.requests <= allowed, api.requests - allowed
    finally:
        api.close()
