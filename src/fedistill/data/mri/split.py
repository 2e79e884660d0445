"""Train/test splits that keep test anatomy out of training.

Between subjects (`split_subjects`): a fixed share of the patients, drawn once from a fixed seed, is
held out whole, as the papers split IXI and BraTS by subject (BraTS 2023's scans of one patient at
several timepoints stay on one side).

Within one volume (`slab_split`, for the stand-ins that have a single volume per site): adjacent
1 mm slices are near-duplicates, so holding out every k-th slice would test on slices the model has
practically seen. Instead the kept slices are cut into slabs `slab_mm` thick along the slice axis;
every `every`-th slab (slab numbers 1, 1 + every, ...) is test, the rest train, and training slices
within `guard_mm` of a test slice are dropped. Test slices are thus spread over the whole brain
(upper and lower slices alike) and at least `guard_mm` of anatomy away from any training slice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from fedistill.errors import DataError

SLAB_MM = 16.0
EVERY = 4
GUARD_MM = 4.0


def split_subjects(
    names: Sequence[str],
    test_fraction: float,
    source: str,
    patient_of: Callable[[str], str] | None = None,
) -> tuple[list[str], list[str]]:
    """(train, test) subject names: round(n * test_fraction) patients (at least 1) held out with all their
    scans, drawn with a fixed seed from the sorted patients, so the split depends only on which subjects
    are there. `patient_of` names each subject's patient (default: every subject its own patient)."""
    patient_of = patient_of or (lambda name: name)
    ordered = sorted(names)
    patients = sorted({patient_of(n) for n in ordered})
    if len(patients) < 2:
        raise DataError(
            f"{source}: {len(ordered)} subject(s) of {len(patients)} patient(s) found; a train/test split "
            "needs at least 2 patients"
        )
    n_test = min(max(1, round(len(patients) * test_fraction)), len(patients) - 1)
    order = np.random.default_rng(0).permutation(len(patients))
    test = {patients[i] for i in order[:n_test]}
    return [n for n in ordered if patient_of(n) not in test], [n for n in ordered if patient_of(n) in test]


def brats_patient(subject: str) -> str:
    """The patient of a BraTS subject folder: from 2023 on, folders name a scan
    `BraTS-<set>-<patient>-<timepoint>` and a patient's scans at several timepoints share one; older names
    are one patient each."""
    match = re.fullmatch(r"(BraTS-[A-Za-z]+-\d+)-\d+", subject)
    return match.group(1) if match else subject


def slab_split(
    positions_mm: np.ndarray, slab_mm: float = SLAB_MM, every: int = EVERY, guard_mm: float = GUARD_MM
) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices into `positions_mm`, the kept slices' positions along the slice axis."""
    pos = np.asarray(positions_mm, dtype=np.float64)
    slab = np.floor((pos - pos.min()) / slab_mm).astype(np.int64)
    is_test = slab % every == 1
    test = np.flatnonzero(is_test)
    if not len(test):
        return np.flatnonzero(~is_test), test
    gap = np.abs(pos[:, None] - pos[test][None, :]).min(1)
    return np.flatnonzero(~is_test & (gap > guard_mm)), test
