"""Classifiers split into a feature extractor and a classifier head, built by name for a dataset."""

from fedistill.models.base import Classifier, count_parameters
from fedistill.models.registry import build_model, model_names, register_model

__all__ = ["Classifier", "build_model", "count_parameters", "model_names", "register_model"]
