# The one image of ml_assets on Kubernetes: the code server, run and step pods, the training pods and
# the MLflow server all run it (helm/ml-assets, docs/kubernetes.md).
#
#   docker build -t registry.example.com/ml-assets:0.1.0 .                       # CUDA build of torch
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu -t ...:0.1.0-cpu .
#
# TORCH_INDEX picks the PyTorch wheel index: match its CUDA version to your GPU nodes' driver.
# Not built on the development machines (no Docker daemon, no registry reachable there).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, from its own index, pinned: the project's requirement (torch==2.13.0) is then met.
RUN pip install --index-url "${TORCH_INDEX}" "torch==2.13.0"
COPY pyproject.toml README.md /src/
COPY ml_assets /src/ml_assets
RUN pip install /src && python -c "import ml_assets, torch, dagster_k8s; print('torch', torch.__version__)"

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 ml && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/ml_assets ml \
    && mkdir -p /var/lib/ml_assets && chown 10001:10001 /var/lib/ml_assets
COPY --from=build /opt/venv /opt/venv
# The pods' root filesystem is read-only: everything written goes to /tmp and ML_ASSETS_HOME (emptyDirs).
ENV PATH=/opt/venv/bin:$PATH \
    ML_ASSETS_ENV=k8s \
    ML_ASSETS_HOME=/var/lib/ml_assets \
    HOME=/var/lib/ml_assets \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=1
USER 10001:10001
WORKDIR /var/lib/ml_assets
EXPOSE 3030 5000
CMD ["dagster", "api", "grpc", "--host", "0.0.0.0", "--port", "3030", "--module-name", "ml_assets", "--attribute", "code_location"]
