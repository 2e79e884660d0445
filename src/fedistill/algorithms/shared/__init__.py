"""Pieces several algorithm families use: local training and evaluation, the stage-1 model cache,
distillation data sources, model selection, weight averaging, option checks and evaluation oracles.
Nothing here names an algorithm."""
