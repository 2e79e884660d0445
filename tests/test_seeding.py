"""The derived random streams: one per (seed, purpose), whatever type the numbers arrive as."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from fedistill.seeding import derive_seed


def test_a_number_names_one_stream_whatever_its_type():
    """A round or a client id read from a NumPy array or a tensor (np.int64(3), tensor(3)) derived another
    stream than the Python int 3, since the hash read the repr."""
    plain = derive_seed(0, "client", 3, 0.5, True)
    assert derive_seed(np.int64(0), "client", np.int32(3), np.float64(0.5), np.bool_(True)) == plain
    assert derive_seed(0, "client", torch.tensor(3), torch.tensor(0.5), True) == plain
    # Python values keep the streams they always had (recorded runs repeat): the hash of their repr
    digest = hashlib.blake2b(repr((0, "client", 3)).encode(), digest_size=8).digest()
    assert derive_seed(0, "client", 3) == int.from_bytes(digest, "little") & (2**63 - 1)
    assert len({derive_seed(0, "client", 3), derive_seed(0, "client", 4), derive_seed(1, "client", 3)}) == 3
