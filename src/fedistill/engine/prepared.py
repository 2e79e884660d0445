"""The data side of a run, loaded once and shared by every algorithm of a suite."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from fedistill.data.base import LoadedDataset
from fedistill.data.partition import FederatedSplit
from fedistill.federation.messages import Message
from fedistill.tasks import task_class


@dataclass
class Prepared:
    """The data side of a run, shared by every algorithm of a suite. With `site_data_dir` (site_data.py)
    `dataset` is the server's own data, split into its validation holdout and the rest, and `sites` each
    site's own data where this process hosts the sites (in-process; a Flower node loads its own)."""

    dataset: LoadedDataset
    split: FederatedSplit
    sites: list[Prepared] | None = None
    own_data: bool = False  # the sites hold their own records: `split` is the server's data alone
    #: on Flower, the start-up message carrying the server's test set to sites with their own data (built and
    #: checked against max_message_mb once, by validate_setup)
    greeting: Message | None = None

    @functools.cached_property
    def records_hash(self) -> str:
        """A fingerprint of the training records (computed once), so that two sites reading one folder, or a
        site reading the server's, are found out, and a resume finds a site whose records changed."""
        digest = hashlib.sha256()
        for tensor in (self.dataset.train.x, self.dataset.train.y):
            digest.update(np.ascontiguousarray(tensor.numpy()).tobytes())
        return digest.hexdigest()

    def client_sizes(self) -> list[int] | None:
        """Each client's training-sample count, where this process knows them."""
        if self.sites is not None:
            return [len(site.split.client_train[0]) for site in self.sites]
        return None if self.own_data else [len(idx) for idx in self.split.client_train]

    def train_counts(self) -> np.ndarray | None:
        """Each client's training samples per class (clients x classes), where this process knows them; for
        per-pixel sites with their own data, each site's count alone (clients x 1): what a per-pixel split
        counts are the site's own subjects, which no other site shares."""
        if self.sites is not None:
            counts = [site.split.train_counts for site in self.sites]
            if task_class(self.dataset.info).per_pixel:
                return np.array([[int(c.sum())] for c in counts], dtype=np.int64)
            return np.concatenate(counts)
        return None if self.own_data else self.split.train_counts
