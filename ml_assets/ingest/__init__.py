"""Ingest: raw_data, the day's source rows committed to a fresh version-store branch (not on main yet).

- ``assets``: the raw_data asset;
- ``sources``: reading a day from files, S3 or a bundled dataset (its spec section: ``source``, in
  ml_assets.spec.source);
- ``write``: committing the day's tables on a branch;
- ``record``: RawRecord, and the commit's metadata RawCommit.
"""
