"""What every part of an evaluation raises when it cannot be computed."""


class EvaluationError(Exception):
    """The evaluation cannot be computed (no rows, a single class, a champion that cannot read the rows)."""
