"""The training pods on Kubernetes (``training.pod``): their resources and where they are scheduled."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ml_assets.spec.base import StrictModel

QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _quantity(value: str, what: str) -> str:
    if not QUANTITY.match(value):
        raise ValueError(f"{what} {value!r} is not a Kubernetes quantity (e.g. 500m, 4, 16Gi)")
    return value


class TolerationSpec(StrictModel):
    """A Kubernetes toleration of the training pods, e.g. ``{key: nvidia.com/gpu, operator: Exists,
    effect: NoSchedule}``."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds", ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> TolerationSpec:
        if self.key is not None and not LABEL_KEY.match(self.key):
            raise ValueError(f"toleration key {self.key!r} is not a valid label key")
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if self.operator == "Equal" and not self.key:
            raise ValueError("a toleration with operator Equal needs a key (an empty key tolerates all taints only with Exists)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies only to effect NoExecute")
        return self

    def manifest(self) -> dict:
        return self.model_dump(by_alias=True, exclude_none=True)


class TrainingPodSpec(StrictModel):
    """Where and with what the training pods run on Kubernetes (ML_ASSETS_ENV=k8s). Placement only:
    it is not part of the training's code version. The chart's ``training`` values give defaults for
    the node selector and tolerations; the spec's win."""

    cpu: str = Field(default="2", description="CPU request (and limit) of each training pod")
    memory: str = Field(default="8Gi", description="memory request and limit of each training pod")
    shm_size: str = Field(default="2Gi", description="size of the memory-backed /dev/shm (DataLoader workers, NCCL)")
    node_selector: dict[str, str] = {}
    tolerations: list[TolerationSpec] = []
    rendezvous_port: int = Field(default=29400, ge=1024, le=65535, description="torchrun's c10d rendezvous (nodes > 1)")

    @field_validator("cpu", "memory", "shm_size")
    @classmethod
    def _quantities(cls, value: str, info) -> str:
        return _quantity(value, info.field_name)

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if not LABEL_KEY.match(key) or not LABEL_VALUE.match(label):
                raise ValueError(f"node_selector {key}: {label!r} is not a valid label")
        return value
