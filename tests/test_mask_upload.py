"""The label masks sites upload once for a server-side conditional generator (FedIOD, AsynDGAN)."""

from __future__ import annotations

import pytest
import torch

from fedistill.algorithms.shared.mask_upload import collect_masks
from fedistill.errors import FederationError
from fedistill.federation.fleet import Reply
from fedistill.federation.messages import Message


class UploadingFleet:
    """Each client answers `query.masks` with the masks given for it."""

    def __init__(self, masks: dict[int, torch.Tensor]) -> None:
        self.masks = masks

    def broadcast(self, message, clients, *, timeout=None, expect=None):
        return {
            c: Reply(c, Message.build("query.masks", arrays={"label-masks": {"masks": self.masks[c]}}))
            for c in clients
        }


def test_masks_with_a_class_the_condition_lacks_name_the_site():
    """A site's mask value past the condition's classes failed later, in the server's one-hot (on a
    GPU, a device-side assert), without naming the site that sent it."""
    good, bad = torch.zeros(2, 4, 4, dtype=torch.uint8), torch.zeros(2, 4, 4, dtype=torch.uint8)
    bad[0, 1, 1] = 3
    fleet = UploadingFleet({0: good, 1: bad})
    pools, _ = collect_masks(fleet, [0], size=4, limit=0, timeout=None, classes=2)
    assert torch.equal(pools[0], good.long())
    with pytest.raises(FederationError, match=r"client\(s\) \[1\] uploaded masks with classes >= 2"):
        collect_masks(fleet, [0, 1], size=4, limit=0, timeout=None, classes=2)
