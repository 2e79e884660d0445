"""`fedistill predict RUN --algorithm A --input PATH --output PATH`: a trained model's answers on new files.

By the run's task: a classifier writes one CSV (`classify.py`); a segmentation model writes a label
PNG per image and a label volume per NIfTI volume (`segment.py`); a reconstruction model writes a
reconstructed volume per NIfTI volume or HDF5 k-space file (`reconstruct.py`). Inputs are read as the
run's training data were made (channels, size, intensity scale, slicing, undersampling), and answers
lie on their input's own grid. An input the task cannot take, an unreadable file or an answer that
would replace a file (without `--overwrite`) stops the command with one line that names the file; the
kinds and the answers' paths are checked before anything is computed, the files' contents as they are
read (the CSV is written whole or not at all; answers already written for earlier files stay).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from fedistill.data.medical.brain_extraction import RULES, extraction_rule
from fedistill.errors import ConfigError
from fedistill.inference.classify import classify_images
from fedistill.inference.forward import Trained, check_batch_size
from fedistill.inference.inputs import InputFile, check_free, check_kinds, find_inputs, output_paths
from fedistill.inference.reconstruct import reconstruct_hdf5, reconstruct_volume
from fedistill.inference.segment import segment_images, segment_volume

#: What each task takes: {input kind: what it makes of one}.
ACCEPTS: dict[str, dict[str, str]] = {
    "classification": {"image": "one CSV row each"},
    "semantic-segmentation": {"image": "a class-map PNG each", "nifti": "a label volume each"},
    "instance-segmentation": {"image": "an instance-map PNG each"},
    "reconstruction": {
        "nifti": "a fully sampled magnitude volume, undersampled with the run's masks",
        "hdf5": "k-space in fastMRI's layout",
    },
}
#: The answer's suffix for each input kind ("" keeps the input's).
ANSWER_SUFFIX = {"image": ".png", "nifti": "", "hdf5": ""}
#: Datasets of 2D images whose segmentation models are given no NIfTI volume: nothing records how one
#: would become their slices (a brain set's steps would be applied in silence).
IMAGES_ONLY = ("mask-folder",)
#: Datasets of the user's own volumes, read as given: their models learned no brain extraction.
SCANS_AS_GIVEN = ("nifti-folder",)
DEFAULT_CSV = "predictions.csv"


@dataclass(frozen=True)
class Prediction:
    """What a prediction wrote."""

    count: int
    output: Path
    resized: int = 0  # classification: images resized to the model's image size

    def summary(self, model: Trained) -> str:
        """One line for the terminal: the algorithm, how many inputs it answered, where, and how many were
        resized."""
        task, size = model.task.name, model.info.image_size
        line = f"{model.algorithm} ({task}): {self.count} input(s) -> {self.output}"
        return line + (f"; {self.resized} resized to {size}x{size}" if self.resized else "")


def _accepted(model: Trained) -> dict[str, str]:
    task = model.task.name
    if task not in ACCEPTS:
        raise ConfigError(
            f"predict does not handle {task!r} runs; it handles {', '.join(ACCEPTS)} (the run's algorithm "
            f"{model.algorithm!r} trained on dataset {model.config.dataset!r})"
        )
    return ACCEPTS[task]


def predict_path(
    model: Trained,
    input_path: Path,
    output: Path,
    *,
    batch_size: int = 64,
    overwrite: bool = False,
    skull_strip: bool | str = False,
) -> Prediction:
    """Predict every file at `input_path` (a file or a folder) with `model`, answers to `output`;
    `skull_strip`: segmentation of NIfTI head scans, brain extraction first (True or "outline", or
    "tissue": `brain_extraction.RULES`)."""
    check_batch_size(batch_size)
    accepted = _accepted(model)
    # a folder of answers inside the input folder: what an earlier run wrote there is no input
    files = find_inputs(input_path, output if model.task.per_pixel else None)
    check_kinds(files, accepted, f"the {model.task.name} model of {model.algorithm!r}")
    volumes = any(f.kind == "nifti" for f in files)
    if volumes and model.config.dataset in IMAGES_ONLY:
        raise ConfigError(
            f"the model of {model.algorithm!r} learned 2D images of {model.config.dataset}, not volumes: it "
            "does not know how a volume becomes its slices (orientation, intensities, field of view). Give "
            "it images (PNG, TIFF); to segment NIfTI volumes, train on nifti-folder, which cuts them into "
            "slices as predict then does"
        )
    if extraction_rule(skull_strip) and (model.task.outputs_images or not volumes):
        raise ConfigError("--skull-strip applies to NIfTI volumes given to a segmentation model")
    if extraction_rule(skull_strip) and model.config.dataset in SCANS_AS_GIVEN:
        raise ConfigError(
            "--skull-strip applies to models trained on brain sets; "
            f"{model.config.dataset} reads scans as given"
        )
    if not model.task.per_pixel:
        named = output.suffix.lower() == ".csv" and not output.is_dir()
        if not named and output.exists() and not output.is_dir():
            raise ConfigError(
                f"--output {output} is a file, not a .csv file; name the .csv file to write, or a folder "
                f"for {DEFAULT_CSV}"
            )
        csv_path = output if named else output / DEFAULT_CSV
        check_free([csv_path], overwrite)
        resized = classify_images(model, files, csv_path, batch_size)
        return Prediction(len(files), csv_path, resized)
    if output.exists() and not output.is_dir():
        raise ConfigError(f"--output {output} is a file; the answers go to a folder, so name a folder")
    answers = output_paths(files, output, ANSWER_SUFFIX)
    check_free(answers, overwrite, files)
    _dense(model, files, answers, batch_size, skull_strip)
    return Prediction(len(files), output)


def _dense(
    model: Trained, files: list[InputFile], answers: list[Path], batch_size: int, skull_strip: bool | str
) -> None:
    """Segmentation and reconstruction: one answer file per input."""
    images = [i for i, f in enumerate(files) if f.kind == "image"]
    if images:
        segment_images(model, [files[i] for i in images], [answers[i] for i in images], batch_size)
    for file, answer in zip(files, answers, strict=True):
        if file.kind == "nifti" and model.task.outputs_images:
            reconstruct_volume(model, file.path, answer, batch_size)
        elif file.kind == "nifti":
            segment_volume(model, file.path, answer, batch_size, skull_strip)
        elif file.kind == "hdf5":
            reconstruct_hdf5(model, file.path, answer, batch_size)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `fedistill predict`."""
    parser.add_argument("run_dir", metavar="RUN", help="a run directory written by `fedistill run`")
    parser.add_argument(
        "--algorithm", help="which of the run's algorithms predicts (may be left out when the run has one)"
    )
    parser.add_argument(
        "--input",
        required=True,
        metavar="PATH",
        help="an image, a NIfTI volume, an HDF5 k-space file, or a folder of them (searched recursively)",
    )
    parser.add_argument(
        "--output",
        required=True,
        metavar="PATH",
        help=f"classification: the .csv file to write (any other path is a folder that gets {DEFAULT_CSV}); "
        "otherwise the folder of answers, named like the inputs",
    )
    parser.add_argument(
        "--name", help="which model the algorithm exported (default: its global model, student or segmenter)"
    )
    parser.add_argument(
        "--data-dir",
        help="where the run's dataset is (default: the run's own data_dir); read only for a model saved "
        "without its dataset's facts (normalisation, size, classes), by versions before they were recorded",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default), auto, cuda, cuda:N or mps")
    parser.add_argument("--batch-size", type=int, default=64, help="images per forward pass (default 64)")
    parser.add_argument("--overwrite", action="store_true", help="replace answers that already exist")
    parser.add_argument(
        "--skull-strip",
        nargs="?",
        const="outline",
        default="",
        choices=RULES,
        metavar="RULE",
        help="NIfTI head scans to a segmentation model trained on skull-stripped brains: brain extraction "
        "first; RULE outline (the default: the head's outline moved 14 mm inwards; keeps every lesion "
        "deeper than that, and on low slices the orbits) or tissue (the tissue connected to the brain: "
        "a closer brain on a T1 head without contrast, not better on the contrast T1 patients)",
    )


def run_command(args: argparse.Namespace) -> int:
    """Run `fedistill predict`: load the run's model and answer every input; 0 when done."""
    from fedistill.inference.loading import load_model

    check_batch_size(args.batch_size)
    model = load_model(
        Path(args.run_dir), args.algorithm, name=args.name, device=args.device, data_dir=args.data_dir
    )
    result = predict_path(
        model,
        Path(args.input),
        Path(args.output),
        batch_size=args.batch_size,
        overwrite=args.overwrite,
        skull_strip=args.skull_strip,
    )
    print(result.summary(model))
    print(f"{model.algorithm}'s {model.name} model: {model.selection}")  # the selected epoch's, or the last
    return 0
