"""Look trials (`fediod.look_trials`): a site's colour map tried the other way round, and flipped for good
when that site's D_k finds the flipped share more real (look_trials.py)."""

from __future__ import annotations

import pytest
import torch

from algorithm_helpers import check_resume_after_crash
from fedistill.algorithms.fediod import FedIODOptions
from fedistill.algorithms.fediod.look_trials import LookTrials, fold_flip
from fedistill.errors import ConfigError
from test_fediod_dense import _dense_parts
from test_site_looks import _condition, _config, _generator


def test_folding_the_flip_into_a_map_draws_exactly_the_flipped_images():
    g = _generator().eval()
    with torch.no_grad():  # a map that is not the identity
        g.look_matrix[1] = 0.02 * torch.arange(9.0).reshape(3, 3) - 0.05
        g.look_bias[1] = torch.tensor([0.03, -0.01, 0.02])
    condition, noise = _condition([1, 1, 0, 1]), torch.randn(4, 1, 16, 16)
    with torch.no_grad():
        before = g(condition, noise)
    owner = torch.tensor([1, 1, 0, 1])
    trials = LookTrials(steps=2, iters=10)
    shown, flipped = trials.flip(before, owner)
    assert flipped.tolist() == [False, True, False, False]  # every other sample of each share
    colour = before[owner == 1].mean(dim=(0, 2, 3))
    # 2c - x per channel, c the share's mean colour: bright where it was dark
    assert torch.allclose(shown[flipped], 2 * colour[None, :, None, None] - before[flipped], atol=1e-6)
    assert torch.equal(shown[~flipped], before[~flipped])
    assert torch.allclose(trials.colours[1], colour)
    optimizer = torch.optim.Adam(g.parameters(), lr=1e-3)
    g(condition, noise).square().mean().backward()
    optimizer.step()  # Adam's moments exist now
    moment = optimizer.state[g.look_matrix]["exp_avg"].clone()
    with torch.no_grad():
        before = g(condition, noise)
        colour = before[owner == 1].mean(dim=(0, 2, 3))
        fold_flip(g, optimizer, 1, colour)
        after = g(condition, noise)
    assert torch.allclose(after[owner == 1], 2 * colour[None, :, None, None] - before[owner == 1], atol=1e-4)
    assert torch.equal(after[owner == 0], before[owner == 0])  # another site's map is untouched
    assert torch.equal(optimizer.state[g.look_matrix]["exp_avg"][1], -moment[1])
    assert torch.equal(optimizer.state[g.look_matrix]["exp_avg"][0], moment[0])


def test_a_trial_runs_in_each_epochs_first_steps_and_flips_the_map_whose_teacher_sees_more_flipped():
    trials = LookTrials(steps=4, iters=10)
    assert [s for s in range(20) if trials.in_trial(s)] == [0, 1, 2, 3, 10, 11, 12, 13]
    assert [s for s in range(20) if trials.ends(s)] == [3, 13]
    assert LookTrials(steps=12, iters=10).ends(9)  # a trial longer than an epoch ends with it
    g = _generator()
    optimizer = torch.optim.Adam(g.parameters())
    masks = torch.zeros(4, 8, 8, dtype=torch.long)
    masks[:, 2:6, 2:6] = 1  # 16 foreground pixels each
    flipped = torch.tensor([False, True, False, True])
    right = masks.clone()
    wrong = torch.zeros_like(masks)
    wrong[:, 0:2, 0:8] = 1  # 16 pixels, none on the nucleus
    # site 0's teacher finds the nuclei only in its flipped images, site 1's only as drawn
    trials.record(0, torch.where(flipped[:, None, None], right, wrong), masks, flipped)
    trials.record(1, torch.where(flipped[:, None, None], wrong, right), masks, flipped)
    trials.record(2, right[:2], masks[:2], torch.tensor([False, False]))  # no flipped half: no verdict
    half = right.clone()
    half[:, 2:4] = 0  # half the nucleus found: Dice 2 x 8 / (8 + 16)
    trials.record(0, half, masks, torch.zeros(4, dtype=torch.bool))
    assert trials.dice(0, "flipped") == 1.0 and trials.dice(1, "flipped") == 0.0
    assert trials.dice(2, "flipped") is None
    # drawn half of site 0: 2 samples wrong (0 of 32 found), then 4 with half of each nucleus found
    assert trials.dice(0, "drawn") == pytest.approx(2 * 32 / ((32 + 32) + (32 + 64)))
    for site in range(3):
        trials.colours[site] = torch.zeros(3)
    matrix = g.look_matrix.detach().clone()
    assert trials.decide(g, optimizer) == [0]
    assert not torch.equal(g.look_matrix[0], matrix[0]) and torch.equal(g.look_matrix[1:], matrix[1:])
    assert trials.counts == {} and trials.colours == {}  # the next epoch's trial starts afresh


def test_look_trials_need_site_looks_and_a_count():
    refused = r"look_trials tries each site's colour map .*fediod\.site_looks = true"
    with pytest.raises(ConfigError, match=refused):
        FedIODOptions(look_trials=4, preset="paper").validate()
    with pytest.raises(ConfigError, match=r"fediod\.look_trials must be >= 0"):
        FedIODOptions(look_trials=-1).validate()


def test_a_run_with_look_trials_shows_flipped_samples_in_the_trial_only_and_decides_at_its_end(monkeypatch):
    config = _config(site_looks=True, generator_mixture="per-client", look_trials=2, iters_per_epoch=4)
    _, server, fleet = _dense_parts(config)
    flips, sent, decided = [], [], []
    flip, send = LookTrials.flip, fleet.send

    def flip_and_keep(self, x, owner):
        shown, flipped = flip(self, x, owner)
        flips.append((server.step, shown.detach(), flipped))
        return shown, flipped

    monkeypatch.setattr(LookTrials, "flip", flip_and_keep)
    fleet.send = lambda requests, **kw: sent.append(requests) or send(requests, **kw)
    for _ in range(3):
        server.distillation_step(fleet)
        decided.append(server.look_trials is not None and server.look_trials.counts == {})
    assert server.iters == 4 and decided == [False, True, True]  # counts after step 0, decided after 1
    assert [step for step, _, flipped in flips if flipped.any()] == [0, 1]  # steps 0 and 1 of 4
    assert not server.options.owner_queries  # every site gets the whole batch
    queries = [r for r in sent if next(iter(r.values())).type == "query.generate"]
    assert len(queries) == 3 and [step for step, _, _ in flips] == [0, 1]  # a request a step, 2 in trial
    for (_, shown, _), query in zip(flips, queries[:2], strict=True):  # what the sites saw, up to the wire
        assert torch.allclose(next(iter(query.values())).tensor("synthetic-inputs", "x"), shown, atol=0.05)


def test_a_run_with_look_trials_resumes_to_the_same_result(tmp_path, monkeypatch):
    """A trial decides within its epoch, so a checkpoint (after an epoch) holds nothing of it but G and its
    optimiser; site 0 is made to prefer its flipped half, so every epoch folds a flip."""
    from fedistill.algorithms.fediod.server import FedIODServer

    config = _config(site_looks=True, generator_mixture="per-client", look_trials=3, iters_per_epoch=4,
                     synthetic_batch_size=6)  # fmt: skip  # two samples or more a site: one of each half
    dice = LookTrials.dice
    monkeypatch.setattr(
        LookTrials,
        "dice",
        lambda self, site, half: (
            None if dice(self, site, half) is None else float(site == 0) * (half == "flipped")
        ),
    )
    folds = []
    monkeypatch.setattr(
        "fedistill.algorithms.fediod.look_trials.fold_flip",
        lambda *a, fold=fold_flip: folds.append(1) or fold(*a),
    )
    check_resume_after_crash(config.replace(rounds=3, stage1_cache=False), FedIODServer, tmp_path)
    assert len(folds) == 6  # one flip of site 0's map an epoch: 3 in the whole run, 2 + 1 around the crash


@pytest.mark.parametrize(("margin", "flips"), [(0.0, [0]), (0.3, [0]), (0.4, [])])
def test_a_margin_keeps_a_map_unless_the_flipped_half_wins_by_more(margin, flips):
    trials = LookTrials(steps=2, iters=10, margin=margin)
    masks = torch.zeros(2, 8, 8, dtype=torch.long)
    masks[:, 2:6, 2:6] = 1  # 16 pixels each
    half = masks[0].clone()
    half[2:4] = 0  # the drawn sample: half the nucleus found, Dice 2 x 8 / (8 + 16) = 2/3
    trials.record(0, torch.stack([half, masks[1]]), masks, torch.tensor([False, True]))
    trials.colours[0] = torch.zeros(3)
    assert (trials.dice(0, "drawn"), trials.dice(0, "flipped")) == (pytest.approx(2 / 3), 1.0)
    g = _generator()
    assert trials.decide(g, torch.optim.Adam(g.parameters())) == flips  # 1 - 2/3 = 0.33 to beat the margin


def test_the_margin_is_a_dice_in_zero_to_one():
    with pytest.raises(ConfigError, match=r"look_trial_margin is a Dice margin in \[0, 1\); got 1.5"):
        FedIODOptions(look_trial_margin=1.5).validate()
