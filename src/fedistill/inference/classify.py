"""Classification: a CSV with one row per image, `path,label,class_name,confidence,resized_from`.

`label` is the class index the model's logits rank first and `confidence` its softmax probability;
`resized_from` is the image's own `HxW` when it had to be resized to the model's image size (empty
when it had that size already), because a resized image is not what the model was trained on.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedistill.inference.forward import Trained, chunks, outputs
from fedistill.inference.images import model_image
from fedistill.inference.inputs import InputFile

COLUMNS = ("path", "label", "class_name", "confidence", "resized_from")


def classify_images(model: Trained, files: Sequence[InputFile], csv_path: Path, batch_size: int) -> int:
    """Write the CSV of `files` to `csv_path` (whole, or not at all); returns how many were resized."""
    info = model.info
    names = info.class_names
    rows = []
    for part in chunks(len(files), batch_size):
        batch = files[part]
        read = [model_image(f.path, info.channels, info.image_size) for f in batch]
        images = torch.from_numpy(np.stack([image for image, _ in read]))
        probabilities = outputs(model, images, batch_size).softmax(1)
        confidence, labels = probabilities.max(1)
        answers = zip(batch, read, labels.tolist(), confidence.tolist(), strict=True)
        for file, (_, (h, w)), label, p in answers:
            resized = "" if (h, w) == (info.image_size, info.image_size) else f"{h}x{w}"
            name = names[label] if label < len(names) else str(label)
            rows.append((file.relative.as_posix(), label, name, f"{p:.6f}", resized))
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    partial = csv_path.with_name(f".{csv_path.name}.partial")
    with partial.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    partial.replace(csv_path)
    return sum(1 for row in rows if row[-1])
