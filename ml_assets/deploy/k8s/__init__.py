"""Kubernetes (ML_ASSETS_ENV=k8s): the step pods' configuration and the multi-node training Job.

Imports the Kubernetes client only where it talks to a cluster (``ml_assets.training.k8s_launch``),
so that building definitions needs nothing but dagster-k8s.
"""
