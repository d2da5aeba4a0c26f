"""FT-Transformer (Gorishniy et al., "Revisiting Deep Learning Models for Tabular Data", NeurIPS 2021)
as an ml_assets model factory: ``ft_transformer.model:build``."""
