"""Reconstruction: undersampled MRI in, reconstructed magnitude volumes out.

Inputs, as the run's training data were made (`fedistill.data.mri`):

- a NIfTI magnitude volume, fully sampled: cut into slices along the axis the run's dataset used
  (axial, or the file's third axis with `slice_axis = "stored"`), padded to square, resized to
  `image_size`, scaled to a maximum of 1, then undersampled exactly as the run's task undersampled its
  training slices (its mask kind, acceleration, centre fraction, mask mode and seed; slice i of the
  volume gets the mask of index i in the per-slice mode). The answer is a NIfTI volume on the input's
  grid, in its intensity units (the scale is undone), written with its affine and header.
- an HDF5 file in fastMRI's layout (`kspace`: complex (slices, H, W), or (slices, coils, H, W) combined
  by root-sum-of-squares), cropped to fastMRI's 320x320 as the fastMRI loader crops. Fully sampled
  k-space is undersampled with the run's masks as above; a file with a `mask` dataset (fastMRI's test
  release) holds k-space measured on that mask already, and its zero-filled image goes to the model as
  it is. The answer is an HDF5 file with a `reconstruction` dataset (slices, h, w), as fastMRI's.
"""

from __future__ import annotations

import logging
from pathlib import Path

import h5py
import numpy as np
import torch

from fedistill.data.mri.fastmri import kspace_magnitudes
from fedistill.data.mri.slices import pad_to_square, resize
from fedistill.data.transforms import normalize
from fedistill.errors import DataError
from fedistill.inference.forward import Trained, chunks, dataset_options, device_of
from fedistill.inference.volumes import read_nifti, write_like

log = logging.getLogger(__name__)


@torch.no_grad()
def _run(model: Trained, slices: np.ndarray, measured: bool, batch_size: int) -> np.ndarray:
    """Model outputs (S, size, size) for slices (S, size, size) in [0, 1]: fully sampled ones are
    undersampled by the task first (what its batches do), `measured` ones are zero-filled already."""
    task, module = model.task, model.module
    module.eval()
    device = device_of(module)
    out = []
    for part in chunks(len(slices), batch_size):
        x = torch.from_numpy(np.ascontiguousarray(slices[part], dtype=np.float32))[:, None]
        if measured:
            inputs = normalize(x, model.info).to(device)
        else:
            inputs = task.net_inputs(model.preprocess(x).to(device), torch.arange(part.start, part.stop))
        out.append(task.predict(module, inputs).clamp(min=0).float().cpu()[:, 0].numpy())
    return np.concatenate(out)


def reconstruct_slices(
    model: Trained, raw: np.ndarray, source: Path, measured: bool, batch_size: int
) -> np.ndarray:
    """Reconstructions (S, H, W) of magnitude slices `raw` (S, H, W), in `raw`'s units and grid."""
    h, w = raw.shape[1:]
    square = resize(pad_to_square(np.clip(raw, 0.0, None)), model.info.image_size)
    peak = float(square.max()) if square.size else 0.0
    if peak <= 0:
        raise DataError(f"{source}: the volume is empty (no positive intensity); replace the file")
    output = _run(model, np.clip(square / peak, 0.0, 1.0), measured, batch_size) * peak
    m = max(h, w)
    back = resize(output, m)
    top, left = (m - h) // 2, (m - w) // 2
    return np.ascontiguousarray(back[:, top : top + h, left : left + w], dtype=np.float32)


def reconstruct_volume(model: Trained, path: Path, answer: Path, batch_size: int) -> None:
    """Reconstruct every slice of a NIfTI volume along the run's slice axis and write them as a volume like
    the input."""
    volume = read_nifti(path)
    if dataset_options(model).get("slice_axis", "axial") == "stored":
        raw = volume.stored.transpose(2, 0, 1)
        result = reconstruct_slices(model, raw, path, False, batch_size).transpose(1, 2, 0)
    else:  # axial: (R, A, S) -> (S, A, R) with anterior up, and back
        raw = volume.canonical.transpose(2, 1, 0)[:, ::-1, :]
        slices = reconstruct_slices(model, raw, path, False, batch_size)
        result = volume.from_canonical(slices[:, ::-1, :].transpose(2, 1, 0))
    write_like(volume, np.ascontiguousarray(result, dtype=np.float32), answer)


def _magnitudes(path: Path, f: h5py.File) -> np.ndarray:
    """|ifft2c(k-space)| per slice, as the fastMRI loader reads its files."""
    return kspace_magnitudes(f, path, "predict reads HDF5 files in fastMRI's layout")


def reconstruct_hdf5(model: Trained, path: Path, answer: Path, batch_size: int) -> None:
    """Reconstruct the slices of a fastMRI HDF5 file and write them as its `reconstruction`; a file's own
    mask is used when it has one."""
    try:
        with h5py.File(path, "r") as f:
            measured = "mask" in f
            raw = _magnitudes(path, f)
            attrs = {k: f.attrs[k] for k in ("acquisition", "patient_id") if k in f.attrs}
    except OSError as e:
        raise DataError(f"cannot read HDF5 file {path} ({e}); replace the file") from e
    if measured and model.task.data_consistency:  # its lines were measured on another grid than ours
        log.warning(
            "%s holds undersampled k-space measured on its own mask: reconstructing without data "
            "consistency (the model's correction of the zero-filled image only)",
            path,
        )
    result = reconstruct_slices(model, raw, path, measured, batch_size)
    answer.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(answer, "w") as out:
        out.create_dataset("reconstruction", data=result)
        out.attrs.update(attrs)
        out.attrs["max"] = float(result.max())
        out.attrs["undersampled_by"] = "file mask" if measured else "run task mask"
