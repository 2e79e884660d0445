"""Exporting the model a run trained: safetensors (weights and what rebuilds them), ONNX (opset of the
torch.export-based exporter, the batch axis dynamic) or TorchScript (traced), with a model card beside it.

    fedistill export RUN --algorithm fedavg --format onnx        # RUN/fedavg/export/global.onnx

The exported ONNX and TorchScript models take normalised inputs (the card's preprocessing) and return the
raw outputs (logits or images); a reconstruction net that learns a correction (`task.residual`) is
exported with its input added back, so the file returns the image. Data consistency needs the measured
k-space, which the file does not take: it is left to the caller. Every ONNX or TorchScript export is run
once on random inputs and compared with PyTorch; the card records the largest difference, and one above
the tolerance (`CHECK_TOLERANCE`) fails the export (the file and its card stay written; a file the runtime
cannot run stops the export with one line: it stays written, without a card).
"""

from __future__ import annotations

import argparse
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch

from fedistill.errors import ConfigError, UserError
from fedistill.inference.loading import load_model
from fedistill.inference.model_card import architecture_facts, card_paths, model_card, write_model_card
from fedistill.inference.trained_model import TrainedModel

#: Export format -> the file's suffix.
FORMATS = {"safetensors": ".safetensors", "onnx": ".onnx", "torchscript": ".pt"}
EXPORT_FOLDER = "export"
INPUT_NAME, OUTPUT_NAME = "inputs", "outputs"


class ExportError(UserError):
    """A model the chosen format cannot express."""


def check_format(format: str) -> str:
    """`format` if it is one of the export formats, else a ConfigError listing them."""
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r} (valid: {', '.join(FORMATS)})")
    return format


def target_path(model: TrainedModel, format: str, output: str | Path | None) -> Path:
    """Where the export goes: `output` (a file, or a folder when it exists or has no suffix), else
    `<run>/<algorithm>/export/<model name><suffix>`."""
    filename = f"{model.name}{FORMATS[format]}"
    if output is None:
        if model.run_dir is None:
            raise ConfigError("this model comes from no run directory; give an output path")
        return model.run_dir / EXPORT_FOLDER / filename
    path = Path(output)
    if path.is_dir() or not path.suffix:
        return path / filename
    if path.suffix != FORMATS[format]:
        raise ConfigError(f"--output {path}: an export as {format} is a {FORMATS[format]} file")
    return path


def example_inputs(model: TrainedModel, batch: int = 2, seed: int = 0) -> torch.Tensor:
    """Inputs of the model's shape, already preprocessed: normal noise for images, token ids for text."""
    generator = torch.Generator().manual_seed(seed)
    if model.info.text is not None:
        ids = torch.randint(0, model.info.text.vocab_size, (batch, *model.input_shape), generator=generator)
        return ids.to(model.device)
    return torch.randn((batch, *model.input_shape), generator=generator).to(model.device)


def export_model(model: TrainedModel, format: str, path: Path) -> dict[str, Any] | None:
    """Write `model` to `path` in `format`; for ONNX and TorchScript the check against PyTorch (the largest
    absolute difference of their outputs on random inputs), None where it cannot run."""
    check_format(format)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.module.eval()
    if format == "safetensors":
        _save_safetensors(model, path)
        return None
    example = example_inputs(model)
    try:
        if format == "onnx":
            _save_onnx(exported_module(model), example, path)
        else:
            _save_torchscript(exported_module(model), example, path)
    except (ConfigError, OSError):
        raise
    except Exception as exc:  # an operator the format lacks, a model the tracer cannot follow
        raise ExportError(
            f"cannot export {model.architecture or 'the model'} to {format}: {_first_line(exc)}"
        ) from exc
    try:
        return verify(model, format, path)
    except Exception as exc:  # a runtime older than the file's opset, an operator it lacks
        raise ExportError(
            f"{path} was written, but {_runtime(format)} cannot run it ({_first_line(exc)}), so it is not "
            "checked against PyTorch and has no model card; a newer runtime may run it"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def exported_module(model: TrainedModel) -> torch.nn.Module:
    """What an ONNX or TorchScript file computes: the module, a reconstruction net with its residual and
    output scale (`Reconstruction.standalone`)."""
    from fedistill.tasks.reconstruction import Reconstruction

    task = model.task
    return task.standalone(model.module) if isinstance(task, Reconstruction) else model.module


def _save_safetensors(model: TrainedModel, path: Path) -> None:
    from fedistill.disk import save_tensors
    from fedistill.inference.model_card import preprocessing

    metadata = {
        "algorithm": model.algorithm,
        "exported_model": model.name,
        "architecture": model.architecture,
        "task": model.task.name,
        # what turns the net's raw output into the task's answer (a reconstruction's residual and scale)
        "task_options": json.dumps(model.task.options()),
        "dataset": model.info.name,
        # the dataset's facts, and the norm resolved ("auto" is the model's default) with its group count:
        # GroupNorm's weights have one shape for every group count, so a wrong count loads and answers wrong
        "dataset_info": model.info.to_json(),
        **{key: str(value) for key, value in architecture_facts(model).items() if value is not None},
        "model_options": json.dumps(model.config.options.get("model_options", {})),
        "preprocessing": json.dumps(preprocessing(model)),
        # what the weights alone do not say (a DistilBERT's transformers config)
        **getattr(model.module, "export_metadata", dict)(),
    }
    state = {k: v.detach().cpu().contiguous() for k, v in model.module.state_dict().items()}
    save_tensors(state, path, metadata)  # atomically, with its header's keys in one order: equal bytes


#: Above this many bytes of weights an ONNX export keeps them in a `.onnx.data` file beside the graph
#: (one protobuf file cannot exceed 2 GB).
ONNX_INLINE_LIMIT = 1_800_000_000


def _parameter_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _save_onnx(module: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise ConfigError(
            "format onnx needs the export extra: pip install -e '.[export]' (or fedistill[export])"
        ) from None
    batch = torch.export.Dim("batch")
    exporter_log = logging.getLogger("torch.onnx")  # it notes every optional library it does not find
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's notes on operators it decomposes
            torch.onnx.export(
                module,
                (example,),
                str(path),
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_shapes=({0: batch},),
                dynamo=True,
                # one self-contained file (the weights inline; protobuf's 2 GB limit applies): with a
                # sidecar `.onnx.data` file, copying the .onnx alone broke it
                external_data=_parameter_bytes(module) >= ONNX_INLINE_LIMIT,
                verbose=False,
            )
    finally:
        exporter_log.setLevel(level)


def _save_torchscript(module: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # shape checks the tracer records as constants
        traced = torch.jit.trace(module, example)
    traced.save(str(path))


def run_exported(format: str, path: Path, inputs: torch.Tensor) -> torch.Tensor:
    """The outputs of an exported ONNX (with onnxruntime) or TorchScript file on `inputs`."""
    if format == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return torch.from_numpy(session.run(None, {INPUT_NAME: inputs.cpu().numpy()})[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript
        loaded = torch.jit.load(str(path), map_location="cpu")
    with torch.no_grad():
        return loaded(inputs.cpu())


#: An export's outputs may differ from PyTorch's by this much times the larger of 1 and PyTorch's largest
#: output magnitude (other kernels round differently; a wrong graph differs by far more).
CHECK_TOLERANCE = 1e-3


def verify(
    model: TrainedModel, format: str, path: Path, inputs: torch.Tensor | None = None
) -> dict[str, Any] | None:
    """The largest absolute difference between the exported file's outputs and PyTorch's on `inputs`
    (default: 3 random inputs, a batch size the export did not trace with), the tolerance it is held to
    (`CHECK_TOLERANCE`) and whether it is within; None without onnxruntime."""
    if format == "onnx":
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            return None
    inputs = example_inputs(model, batch=3, seed=1) if inputs is None else inputs
    with torch.no_grad():
        expected = exported_module(model)(inputs.to(model.device)).cpu()
    got = run_exported(format, path, inputs)
    if got.shape != expected.shape:
        difference = float("inf")
    else:
        difference = float((got.float() - expected.float()).abs().max()) if expected.numel() else 0.0
    tolerance = CHECK_TOLERANCE * max(1.0, float(expected.abs().max()) if expected.numel() else 0.0)
    return {
        "max_abs_difference": difference,
        "tolerance": tolerance,
        "within": difference <= tolerance,
        "inputs": int(inputs.shape[0]),
        "runtime": _runtime(format),
    }


def _runtime(format: str) -> str:
    if format == "onnx":
        import onnxruntime

        return f"onnxruntime {onnxruntime.__version__}"
    return f"torch.jit {torch.__version__}"


def export(
    run_dir: str | Path,
    algorithm: str | None = None,
    format: str = "safetensors",
    output: str | Path | None = None,
    *,
    name: str | None = None,
    data_dir: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Export the model `algorithm` trained in `run_dir` (see `load_model`) in `format` to `output`
    (default `<run>/<algorithm>/export/`), with its card beside it (`<file>.card.md` and `.card.json`);
    an existing file there is replaced only with `overwrite`."""
    from fedistill.engine.summary import read_summary

    check_format(format)
    model = load_model(run_dir, algorithm, name=name, data_dir=data_dir)
    assert model.run_dir is not None
    path = target_path(model, format, output)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} already exists; pass --overwrite to replace it, or another --output")
    check = export_model(model, format, path)
    write_model_card(path, model_card(model, read_summary(model.run_dir), path, format, check))
    if check is not None and not check["within"]:
        raise ExportError(
            f"{path} was written, but its outputs differ from PyTorch's by {check['max_abs_difference']:.3g} "
            f"(tolerance {check['tolerance']:.3g}): do not use it; the card records the check"
        )
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `fedistill export`."""
    parser.add_argument("run_dir", metavar="RUN", help="a run directory written by `fedistill run`")
    parser.add_argument("--algorithm", help="whose model (may be left out when the run holds one algorithm)")
    parser.add_argument(
        "--format",
        choices=list(FORMATS),
        default="safetensors",
        help="the file format (default: safetensors)",
    )
    parser.add_argument("--output", metavar="PATH", help="file or folder (default: RUN/ALGORITHM/export/)")
    parser.add_argument("--name", help="which exported model (default: global, student or segmenter)")
    parser.add_argument(
        "--data-dir",
        help="where the run's dataset is (default: the run's own data_dir); read only for a model saved "
        "without its dataset's facts (normalisation, size, classes), by versions before they were recorded",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an export that already exists")


def run_command(args: argparse.Namespace) -> int:
    """`fedistill export`: write the model and its card, print where."""
    path = export(
        args.run_dir,
        args.algorithm,
        args.format,
        args.output,
        name=args.name,
        data_dir=args.data_dir,
        overwrite=args.overwrite,
    )
    print(f"exported {path} (model card: {card_paths(path)[1]})")
    return 0
