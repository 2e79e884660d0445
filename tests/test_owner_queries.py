"""FedIOD's `owner_queries`: with the per-client G and owner labels each site is sent, and answers for,
only the samples G drew for it. The step is the one every site answering for the whole batch gives (where
no term couples a batch's samples), the ledger shows each site's share crossing instead of the batch, a
teacher's class balance runs over its own samples, and what needs every teacher on every sample is
refused with it."""

import copy
import dataclasses
import functools
import logging

import pytest
import torch

from fedistill.algorithms.fediod import FedIODOptions, client
from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.options import resolve_options
from fedistill.algorithms.fediod.owner_split import OwnerSplit
from fedistill.config import RunConfig, build_config
from fedistill.errors import ConfigError
from fedistill.federation.ledger import DOWN, UP, Ledger, read_ledger
from fedistill.transports.inprocess import InProcessFleet
from test_fediod_dense import SEGMENTATION, fediod_parts
from test_site_looks import _config

OWNER = {
    "generator_mixture": "per-client",
    "site_looks": True,
    "ensemble_weighting": "owner",
    "use_unique": False,
    "student_steps": 0,
    "pool_generator_batch": True,
    "pool_size": 64,
    "pool_steps": 1,
    "synthetic_batch_size": 6,
    "wire": "float32",
}


def _step(owner_queries: bool, ledger: Ledger | None = None, **extra):
    clients, server, _ = fediod_parts(_config(**OWNER, owner_queries=owner_queries, **extra))
    fleet = InProcessFleet(clients, ledger or Ledger(None))
    server.setup(fleet)
    owner = server.step_draw(server.step, server.step_sites(server.step))[0].owner
    server.distillation_step(fleet)
    fleet.ledger.flush()
    return clients, server, owner


def test_asking_only_the_owner_gives_the_step_every_site_answering_gives(monkeypatch):
    """Instance-normed D_k (no batch statistics across samples) and no class balance: G, the student and
    every D_k come out of one G-step as when every site answers for the whole batch, since a site's own
    terms see its own samples only and owner labels read only the owner's logits."""
    per_sample_d = functools.partial(client.build_conditional_discriminator, norm="instance")
    monkeypatch.setattr(client, "build_conditional_discriminator", per_sample_d)
    full_clients, full, owner = _step(False, w_balance=0.0)
    split_clients, split, _ = _step(True, w_balance=0.0)
    assert len(set(owner.tolist())) == 2  # both sites own part of the batch
    for a, b in zip(full.generator.parameters(), split.generator.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for a, b in zip(full.student.parameters(), split.student.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for cid in full_clients:
        d_full = full_clients[cid].discriminator.parameters()
        d_split = split_clients[cid].discriminator.parameters()
        for a, b in zip(d_full, d_split, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_each_site_is_sent_and_sends_only_its_own_samples(tmp_path):
    _, full, _ = _step(False, Ledger(tmp_path / "full.jsonl"))
    _, split, owner = _step(True, Ledger(tmp_path / "split.jsonl"))
    info, view = split.ctx.info, split.view
    image = info.channels * info.image_size**2 * 4  # float32 bytes of one synthetic image
    logits = int(torch.tensor(view.sent_shape(1)).prod()) * 4

    def by_message(name: str) -> dict[tuple[str, str, int], dict[str, int]]:
        rows = read_ledger(tmp_path / name)
        return {
            (r["type"], r["direction"], r["client"]): r["kinds"]
            for r in rows
            if r["type"].startswith("query.")
        }

    full_rows, split_rows = by_message("full.jsonl"), by_message("split.jsonl")
    for position, cid in enumerate(split.federation.clients):
        n = int((owner == position).sum())
        assert 0 < n < len(owner)
        assert split_rows[("query.generate", DOWN, cid)]["synthetic-inputs"] == n * (image + 4 + 8)
        assert split_rows[("query.generate", UP, cid)]["logits"] == n * logits
        assert split_rows[("query.backprop", UP, cid)]["input-gradients"] == n * image
        assert full_rows[("query.generate", UP, cid)]["logits"] == len(owner) * logits
        assert full_rows[("query.backprop", UP, cid)]["input-gradients"] == len(owner) * image
    assert full.step == split.step == 1


def test_a_teachers_balance_runs_over_its_own_rows():
    torch.manual_seed(0)
    z, pi = torch.randn(2, 5, 3), torch.tensor([0.3, 0.7])
    rows = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 1, 1, 1]], dtype=torch.bool)
    own = [z[0, :2], z[1, 2:]]
    want = sum(
        p * (m * torch.log2(m)).sum()
        for p, m in zip(pi, [torch.softmax(o, -1).mean(0) for o in own], strict=True)
    )
    torch.testing.assert_close(L.balance_loss(z, pi, rows), want)
    assert torch.equal(L.balance_loss(z, pi, torch.ones(2, 5, dtype=torch.bool)), L.balance_loss(z, pi))


def test_the_split_puts_each_sites_rows_back_in_place_with_the_gradient_to_what_it_sent():
    owner = torch.tensor([0, 0, 1, 2, 2])
    split = OwnerSplit.of(owner, [10, 11, 12], {10: 0, 11: 1, 12: 2})
    parts = {cid: torch.randn(len(split.rows[cid]), 2, 2, 2, requires_grad=True) for cid in (10, 12)}
    to_rows = lambda z: z.movedim(-3, -1).reshape(1, -1, 2)  # noqa: E731  (1, n, C, H, W) -> (1, n·H·W, C)
    full, mine = split.stacked_rows(parts, [10, 12], to_rows)
    assert full.shape == (2, 5 * 4, 2)
    assert torch.equal(full[0, :8], to_rows(parts[10][None])[0]) and torch.equal(
        full[1, 12:], to_rows(parts[12][None])[0]
    )
    assert mine.sum(1).tolist() == [8, 8] and not full[0, 8:].any()
    full.sum().backward()
    assert torch.equal(parts[10].grad, torch.ones_like(parts[10]))
    assert split.answered([10, 12]).tolist() == [True, True, False, True, True]  # site 11 did not answer
    total = torch.zeros(5, 1)
    split.scatter(total, 12, torch.tensor([[1.0], [2.0]]))
    assert total.flatten().tolist() == [0, 0, 0, 1, 2]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ensemble_weighting": "eq8"}, r"set fediod\.ensemble_weighting = 'owner'"),
        ({"use_unique": True}, r"set fediod\.use_unique = false too"),
        ({"student_steps": 2}, r"set fediod\.student_steps = 0"),
        ({"teacher_logits": "centred"}, r"'centred' would calibrate each teacher over its own share"),
        ({"teacher_logits": "scaled"}, r"set fediod\.teacher_logits = 'raw' or 'log-probabilities'"),
    ],
)
def test_what_needs_every_teacher_on_every_sample_is_refused(changes, message):
    settings = {**OWNER, "owner_queries": True, **changes}
    config = _config(**settings)
    options = FedIODOptions(**settings)
    with pytest.raises(ConfigError, match=message):
        resolve_options(config, options, per_pixel=True, mask_shapes_images=True)


def test_owner_labels_without_the_per_client_mixture_are_refused_once_the_task_is_known():
    """The auto preset gives nuclei the per-client mixture, so owner labels pass the first check; on a
    task whose preset keeps one G they are refused when the options are resolved."""
    FedIODOptions(ensemble_weighting="owner").validate()
    config = _config(ensemble_weighting="owner")
    with pytest.raises(ConfigError, match=r"generator_mixture = 'per-client' too"):
        resolve_options(
            config, FedIODOptions(ensemble_weighting="owner"), per_pixel=True, two_class_pixels=True
        )


def test_the_lean_default_on_nuclei_asks_owners_only_and_a_users_own_choices_keep_every_site_asked():
    """Nuclei: the lean preset asks each site about its own samples; a user who keeps the disagreement
    term, names other labels or S-steps keeps every site answering for the whole batch instead of an
    error, and one who names the mixture chooses what goes with it."""

    def resolved(**mine):
        layer = copy.deepcopy(SEGMENTATION)
        del layer["fediod"]["student_steps"]  # the tests' small run sets S-steps; the preset's have none
        layer["fediod"].update(mine)
        config = build_config(RunConfig(), layer, {"algorithm": "fediod"})
        return resolve_options(config, FedIODOptions(**mine), per_pixel=True, mask_shapes_images=True)

    nuclei = resolved()
    assert (nuclei.owner_queries, nuclei.ensemble_weighting, nuclei.use_unique) == (True, "owner", False)
    assert not resolved(use_unique=True).owner_queries
    assert resolved(use_unique=True).ensemble_weighting == "owner"
    assert not resolved(ensemble_weighting="eq8").owner_queries
    assert not resolved(student_steps=1).owner_queries
    shared = resolved(generator_mixture="shared")
    assert (shared.owner_queries, shared.ensemble_weighting, shared.use_unique) == (False, "eq8", True)
    assert (nuclei.w_adv, shared.w_adv) == (0.1, 0.2)  # the weaker adversarial term goes with owner labels
    assert resolved(ensemble_weighting="owner").owner_queries


def test_the_samples_of_a_site_that_does_not_answer_are_left_out_of_the_step():
    clients, server, _ = fediod_parts(_config(**OWNER, owner_queries=True))
    fleet = InProcessFleet(clients, Ledger(None))
    server.setup(fleet)
    first = server.federation.clients[0]
    honest = clients[first].handle

    def handle(message):
        if message.type == "query.generate":
            raise RuntimeError("site down")
        return honest(message)

    clients[first].handle = handle
    owner = server.step_draw(server.step, server.step_sites(server.step))[0].owner
    before = len(server.pool)
    metrics = server.distillation_step(fleet)
    assert len(server.pool) - before == int((owner != 0).sum()) < len(owner)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))


def test_owner_queries_over_a_flower_grid_match_in_process(tmp_path):
    """Flower carries each site's own share as in-process does: the same ledger rows, the same student."""
    import json

    from fedistill.engine.flower.apps import make_client_app
    from fedistill.engine.launch import run_suite
    from flower_local_grid import LocalGrid, run_on_grid

    config = _config(**OWNER, owner_queries=True)
    here = run_suite(config, tmp_path / "here", progress=False)[0]
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    there = run_on_grid(config, tmp_path / "flower", grid)[0]

    def traffic(run: str) -> list[str]:  # a grid sends a round's requests before any reply
        records = read_ledger(tmp_path / run / "fediod" / "ledger.jsonl")
        return sorted(
            json.dumps([r["direction"], r["client"], r["type"], r["kinds"]])
            for r in records
            if r["type"] != "query.hello"
        )

    assert traffic("flower") == traffic("here")
    assert there["transport"] == "flower"
    assert there["test_dice"] == pytest.approx(here["test_dice"], abs=1e-6)


def test_on_classification_each_site_labels_only_its_own_samples(tmp_path):
    """The per-client G on classification (latent one-hot, no masks): a G-step sends each site its share,
    its logits come back one row per own sample, and G and the student train."""
    from algorithm_helpers import TINY_FEDIOD

    layer = copy.deepcopy(TINY_FEDIOD)
    layer["fediod"].update(
        generator_mixture="per-client",
        ensemble_weighting="owner",
        use_unique=False,
        owner_queries=True,
        student_steps=0,
        pool_generator_batch=True,
        pool_size=256,
        pool_steps=1,
        wire="float32",
    )
    config = build_config(RunConfig(), layer, {"algorithm": "fediod"})
    clients, server, _ = fediod_parts(config)
    fleet = InProcessFleet(clients, Ledger(tmp_path / "ledger.jsonl"))
    server.setup(fleet)
    batch = server.options.synthetic_batch_size
    owner = server.step_draw(server.step, server.step_sites(server.step))[0].owner
    before = [p.detach().clone() for p in server.generator.parameters()]
    server.distillation_step(fleet)
    fleet.ledger.flush()
    up = {
        r["client"]: r["kinds"]["logits"]
        for r in read_ledger(tmp_path / "ledger.jsonl")
        if r["type"] == "query.generate" and r["direction"] == UP
    }
    classes = server.ctx.info.num_classes
    for position, cid in enumerate(server.federation.clients):
        n = int((owner == position).sum())
        assert up.get(cid, 0) == n * classes * 4
    assert sum(up.values()) == batch * classes * 4 and len(server.pool) == batch
    assert any(not torch.equal(a, b) for a, b in zip(before, server.generator.parameters(), strict=True))


def test_with_a_sample_of_sites_per_step_only_the_asked_sites_samples_are_learnt():
    clients, server, _ = fediod_parts(_config(**OWNER, owner_queries=True, sites_per_step=1))
    fleet = InProcessFleet(clients, Ledger(None))
    server.setup(fleet)
    (asked,) = server.step_sites(server.step)
    position = server.federation.clients.index(asked)
    owner = server.step_draw(server.step, server.step_sites(server.step))[0].owner
    before = len(server.pool)
    server.distillation_step(fleet)
    assert len(server.pool) - before == int((owner == position).sum()) > 0


def test_auto_logits_stay_raw_under_owner_queries_where_a_site_saw_one_class(tmp_path, caplog):
    """Centring takes a teacher's mean over the rows it labelled: under owner queries only its own share of
    G's batch (one sample: all zeros), so "auto" keeps the logits raw there instead of centring them."""
    from algorithm_helpers import TINY_FEDIOD

    layer = copy.deepcopy(TINY_FEDIOD)
    settings = dict(generator_mixture="per-client", ensemble_weighting="owner", use_unique=False)
    settings |= dict(student_steps=0, pool_generator_batch=True, pool_size=256, pool_steps=1)
    layer["fediod"].update(settings, teacher_logits="auto")
    clients, server, _ = fediod_parts(build_config(RunConfig(), layer, {"algorithm": "fediod"}))
    server.setup(InProcessFleet(clients, Ledger(tmp_path / "ledger.jsonl")))
    one_class = server.federation.counts.clone()
    one_class[0] = 0
    one_class[0, 1] = 7
    server.federation.counts = one_class
    assert server._resolve_teacher_logits()["teacher_logits_centred"] == 1.0  # every site asked: centred
    server.options = dataclasses.replace(server.options, owner_queries=True)
    with caplog.at_level(logging.WARNING):
        assert server._resolve_teacher_logits()["teacher_logits_centred"] == 0.0
    assert server.teacher_logits == "raw" and "under owner_queries" in caplog.text
