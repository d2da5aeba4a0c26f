"""A model's pipeline: its graph (``graph``: stage keys, edges and partition mappings, declared
once), its jobs and schedules (``jobs``), the data-arrival sensor (``arrival``), and ``model``, which
assembles one model's definitions from the stages' builders."""
