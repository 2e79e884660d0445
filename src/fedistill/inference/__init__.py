"""Using a finished run: its results (`read_run`), the model it trained rebuilt for prediction
(`load_model`), and that model exported to safetensors, ONNX or TorchScript with a model card (`export`).

It reads what `engine/` wrote and never writes a run; its modules import torch only when used through
`fedistill.load_model`, `fedistill.summary` and `fedistill export`, so `import fedistill` stays light.
"""

from fedistill.inference.loading import load_model
from fedistill.inference.results import AlgorithmResult, RunResult, read_run
from fedistill.inference.trained_model import InputError, TrainedModel

__all__ = ["AlgorithmResult", "InputError", "RunResult", "TrainedModel", "load_model", "read_run"]
