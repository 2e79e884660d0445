"""What FedIOD's server learns once, after stage 1: the ensemble's ceiling and the sites' masks.

The ceiling is evaluation only (`evaluate.teachers`: each site's outputs on the evaluation harness's
test samples, scored by the harness): the teachers' standalone scores and their weighted ensemble's,
which the student is measured against (`fraction_of_ensemble`). The masks are protocol: with
`mask_source = "clients"` every site uploads the label masks of its training samples once
(`query.masks`, kind `label-masks`), as AsynDGAN's and the paper's G is conditioned on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedistill.algorithms.fediod.calibration import calibrated
from fedistill.algorithms.fediod.robustness import combined_ensemble, screened_logits
from fedistill.algorithms.shared.mask_upload import collect_masks
from fedistill.errors import FederationError
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import ReplySpec

if TYPE_CHECKING:
    from fedistill.algorithms.fediod.server import FedIODServer


def teacher_report(server: FedIODServer, fleet: Fleet) -> dict[str, float]:
    """Standalone scores and the ensemble's score (the one-shot ceiling), evaluation only."""
    assert server.federation is not None
    if not server.view.per_pixel:
        return _classification_report(server, fleet)
    n = _reference_count(server)
    shape = server.view.output_shape(n)
    expect = ReplySpec({"logits": {"z": ArraySpec("float32", shape)}})
    request = Message.build("evaluate.teachers", scalars={"config": {"samples": n}})
    sent = fleet.broadcast(request, server.federation.clients, expect=expect)
    replies = successful(screened_logits(server.options, fleet, sent), what="teacher outputs")
    clients = sorted(replies)
    raw = torch.stack([replies[c].tensor("logits", "z") for c in clients])  # (K, N, ...)
    score = server.ctx.score
    if score is None:
        raise FederationError("FedIOD's teacher report needs the evaluation harness")
    headline = server.view.task.headline
    view = server.view
    rows = calibrated(view.stacked_rows(raw), server.teacher_logits)
    share = server.federation.share(clients, view.outputs)
    ensemble = combined_ensemble(server.options, rows, share[:, None, :])
    teachers = [score(raw[i])[headline] for i in range(len(clients))]
    return {
        f"teacher_mean_{headline}": float(torch.tensor(teachers).mean()),
        f"teacher_std_{headline}": float(torch.tensor(teachers).std(unbiased=False)),
        f"ensemble_{headline}": score(view.unrows(ensemble, raw.shape[1:]))[headline],
        f"ensemble_uniform_{headline}": score(view.unrows(rows.mean(0), raw.shape[1:]))[headline],
        "reference_samples": float(n),
    }


def _reference_count(server: FedIODServer) -> int:
    labels = server.ctx.test_labels
    if labels is None:
        raise FederationError("FedIOD's teacher report needs the evaluation harness's test set")
    limit = server.options.reference_samples
    return len(labels) if not limit else min(limit, len(labels))


def _classification_report(server: FedIODServer, fleet: Fleet) -> dict[str, float]:
    assert server.federation is not None
    labels = server.ctx.test_labels
    if labels is None:
        raise FederationError("FedIOD's teacher report needs the evaluation harness's test labels")
    total, n, c = len(labels), _reference_count(server), server.ctx.info.num_classes
    labels = labels[:n]
    # the request names a count only when `reference_samples` limits it (by default: the whole test set)
    limit = {"config": {"samples": n}} if n < total else {}
    expect = ReplySpec({"logits": {"z": ArraySpec("float32", (n, c))}})
    sent = fleet.broadcast(
        Message.build("evaluate.teachers", scalars=limit), server.federation.clients, expect=expect
    )
    replies = successful(screened_logits(server.options, fleet, sent), what="teacher logits")
    clients = sorted(replies)
    raw = torch.stack([replies[c].tensor("logits", "z") for c in clients])  # (K, N, C)
    logits = calibrated(raw, server.teacher_logits)
    labels = labels.to(raw.device)
    acc = (raw.argmax(-1) == labels).float().mean(1)
    pi = server.federation.pi(clients)
    share = server.federation.share(clients, c)
    shares = share[:, None, :].expand_as(logits)

    def accuracy(ensemble: torch.Tensor) -> float:
        return float((ensemble.argmax(-1) == labels).float().mean())

    log_p = calibrated(raw, "log-probabilities")
    return {
        "teacher_mean_accuracy": float(acc.mean()),
        "teacher_std_accuracy": float(acc.std(unbiased=False)),
        "ensemble_accuracy": accuracy(combined_ensemble(server.options, logits, shares)),
        "ensemble_uniform_accuracy": accuracy(logits.mean(0)),
        "ensemble_pi_accuracy": accuracy((pi[:, None, None] * logits).sum(0)),
        # the same weights on the teachers' log-probabilities (`teacher_logits = "log-probabilities"`)
        "ensemble_log_probabilities_accuracy": accuracy(combined_ensemble(server.options, log_p, shares)),
    }


def upload_masks(server: FedIODServer, fleet: Fleet) -> list[torch.Tensor]:
    """Every site's uploaded label masks, in site order (`query.masks`, once)."""
    assert server.federation is not None
    pools, _ = collect_masks(
        fleet,
        server.federation.clients,
        size=server.ctx.info.image_size,
        limit=server.options.mask_pool,
        timeout=server.ctx.config.timeout or None,
        classes=server.view.condition_classes,
    )
    return pools
