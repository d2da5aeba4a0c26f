"""Model evaluation in plain numpy and scikit-learn: metrics, bootstrap intervals, slices, plots."""
