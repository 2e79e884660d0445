"""Models built by name for a dataset and its task: classifiers split into a feature extractor and a
classifier head, segmentation and reconstruction U-Nets."""

from fedistill.models.base import Classifier, count_parameters
from fedistill.models.registry import (
    build_model,
    check_model_norm,
    check_model_options,
    model_names,
    model_options,
    register_model,
)

__all__ = [
    "Classifier",
    "build_model",
    "check_model_norm",
    "check_model_options",
    "count_parameters",
    "model_names",
    "model_options",
    "register_model",
]
