"""FedIOD's adapted inception score (the paper's Table 7) is scored by each local model T_k, on its own
softmax: calibrated teacher logits (`teacher_logits = "centred"` or `"scaled"`) change those softmaxes for
the ensemble, never for the score."""

import copy

import torch

from algorithm_helpers import TINY_FEDIOD, fediod_parts
from fedistill.algorithms.fediod import generator_step, student
from fedistill.config import RunConfig, build_config
from fedistill.federation.ledger import Ledger
from fedistill.metrics.generation import adapted_inception_score
from fedistill.seeding import torch_generator
from fedistill.transports.inprocess import InProcessFleet


def _parts(**fediod):
    layer = copy.deepcopy(TINY_FEDIOD)
    layer["fediod"] |= {"wire": "float32", "teacher_logits": "centred"} | fediod
    clients, server, _ = fediod_parts(build_config(RunConfig(), layer, {"algorithm": "fediod"}))
    fleet = InProcessFleet(clients, Ledger(None))
    server.setup(fleet)
    return clients, server, fleet


def _spy(monkeypatch, module) -> list[torch.Tensor]:
    scored: list[torch.Tensor] = []

    def spy(logits: torch.Tensor) -> float:
        scored.append(logits.detach().clone())
        return adapted_inception_score(logits)

    monkeypatch.setattr(module, "adapted_inception_score", spy)
    return scored


def test_the_s_steps_score_the_teachers_own_logits_not_the_calibrated_ones(monkeypatch):
    _, server, fleet = _parts(merge_student_queries=False)
    scored = _spy(monkeypatch, student)
    replies = []
    update = server._student_update

    def recording(batch, got, z_name, ratio_name):
        replies.append(torch.stack([got[cid].tensor("logits", z_name) for cid in sorted(got)]))
        return update(batch, got, z_name, ratio_name)

    monkeypatch.setattr(server, "_student_update", recording)
    server.distillation_step(fleet)
    assert len(scored) == len(replies) == 1
    raw = replies[0]
    assert not torch.allclose(raw - raw.mean(dim=1, keepdim=True), raw)  # centring does change them
    torch.testing.assert_close(scored[0], raw)
    assert server.last_coverage["adapted_is"] == adapted_inception_score(raw)


def test_the_generator_batch_is_scored_on_the_teachers_own_logits(monkeypatch):
    clients, server, fleet = _parts(student_steps=0, pool_generator_batch=True, pool_size=64, pool_steps=1)
    scored = _spy(monkeypatch, generator_step)
    g_before, step = copy.deepcopy(server.generator).train(), server.step
    server.distillation_step(fleet)
    latent = torch_generator(server.ctx.config.seed, "latent", step)
    with torch.no_grad():
        x = g_before(g_before.sample_latent(server.options.synthetic_batch_size, latent))
        raw = torch.stack([clients[cid].teacher(x) for cid in sorted(clients)])
    assert len(scored) == 1
    torch.testing.assert_close(scored[0], raw, rtol=1e-4, atol=1e-5)
