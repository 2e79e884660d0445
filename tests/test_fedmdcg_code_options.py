"""FedMD-CG's options that reproduce the released code's training loops: stage 2's gradients summed over
a pass of the cache (`generator_grads`), and a data order fixed once and cycled (`batch_order`)."""

from __future__ import annotations

import pytest
import torch

from algorithm_helpers import SMALL_NON_IID, check_resume_after_crash, make_client
from fedistill.algorithms.fedmdcg import losses as L
from fedistill.algorithms.fedmdcg.fedmdcg_options import FedMDCGOptions
from fedistill.algorithms.fedmdcg.fedmdcg_server import FedMDCGServer
from fedistill.config import RunConfig, build_config, options_for
from fedistill.data.base import ImageSet
from fedistill.engine.checkpoint import latest_checkpoint, read_checkpoint
from fedistill.errors import ConfigError
from fedistill.federation.messages import Message

TINY = {
    **SMALL_NON_IID,
    "rounds": 3,
    "model": "lenet-fedmdcg",
    "lr": 0.1,
    "local_steps": 3,
    "fedmdcg": {"generator_hidden": "16,8", "server_steps": 2, "generator_passes": 2},
}


def _config(**changes) -> RunConfig:
    return build_config(RunConfig(), TINY, changes)


def _round_one() -> Message:
    return Message.build("train", scalars={"config": {"round": 1}})


def _generator_gradients(grads: str, monkeypatch) -> tuple[list, list]:
    """Round 1 of one client: each cached batch's own gradient of G_i's loss, at the parameters it meets
    (autograd.grad, which leaves .grad alone), and the .grad each Adam step reads."""
    client = make_client(_config(**{"fedmdcg.generator_grads": grads}), "fedmdcg")
    params = list(client.generator.parameters())
    own, stepped = [], []
    objective, step = L.generator_objective, client.generator_optimizer.step

    def observed_objective(*args, **kwargs):
        loss = objective(*args, **kwargs)
        found = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        pairs = zip(params, found, strict=True)
        own.append([torch.zeros_like(p) if g is None else g.clone() for p, g in pairs])
        return loss

    def observed_step(*args, **kwargs):
        stepped.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params])
        return step(*args, **kwargs)

    monkeypatch.setattr(L, "generator_objective", observed_objective)
    monkeypatch.setattr(client.generator_optimizer, "step", observed_step)
    reply = client.handle(_round_one())
    assert reply.scalar("metrics", "generator_steps") == len(own) == len(stepped) == 2 * 3
    return own, stepped


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, rtol=1e-5, atol=1e-8) for x, y in zip(a, b, strict=True))


def test_accumulated_generator_gradients_sum_every_earlier_batch_of_the_pass(monkeypatch):
    """The code clears G_i's gradients once per pass: the Adam step at the k-th cached batch reads the
    sum of the gradients of batches 1..k of that pass (each taken where G_i stood then). Two passes of
    three batches: the sums restart with the second pass."""
    own, stepped = _generator_gradients("accumulated", monkeypatch)
    for k in range(6):
        start = 0 if k < 3 else 3
        total = [sum(parts) for parts in zip(*own[start : k + 1], strict=True)]
        assert _same(stepped[k], total), k
    assert not _same(stepped[1], own[1])  # the sum is not the batch's own gradient


def test_per_batch_generator_gradients_are_each_batch_s_own_by_default(monkeypatch):
    assert FedMDCGOptions().generator_grads == "per-batch"
    own, stepped = _generator_gradients("per-batch", monkeypatch)
    assert all(_same(s, o) for s, o in zip(stepped, own, strict=True))


def _numbered_client(n: int, **changes):
    """Client 0 whose n training "images" are their own indices, so each batch names the samples it
    holds; no augmentation, batches of 4."""
    client = make_client(_config(augment="off", batch_size=4, **changes), "fedmdcg")
    client.ctx.train = ImageSet(torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1), torch.zeros(n).long())
    return client


def _visits(client, round: int) -> list[list[int]]:
    """The sample indices of each batch of one round's local steps."""
    return [x.flatten().long().tolist() for x, _ in client._batches(round)]


def _flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def test_cycled_batches_visit_one_fixed_order_over_and_over_across_rounds():
    """The code's persistent loader: 10 samples in one order drawn once, cut in batches of 4, 4 and 2
    (the short last batch kept), read on from where the last round stopped. Two steps a round, so
    rounds 1-3 make exactly two passes, the second the same as the first."""
    client = _numbered_client(10, local_steps=2, **{"fedmdcg.batch_order": "cycled"})
    rounds = [_visits(client, r) for r in (1, 2, 3)]
    batches = [b for r in rounds for b in r]
    assert [len(b) for b in batches] == [4, 4, 2] * 2
    first, second = _flat(batches[:3]), _flat(batches[3:])
    assert sorted(first) == list(range(10)) and first == second
    assert first != list(range(10))  # shuffled once, as the code's split does
    again = _numbered_client(10, local_steps=3, **{"fedmdcg.batch_order": "cycled"})
    assert _flat(_visits(again, 7)) == first  # the order is the client's, not the round's


def test_a_cycled_pass_drops_a_last_batch_of_one_sample_as_the_codes_loader_does():
    """BatchNorm cannot train on a batch of one: with 9 samples the pass is two batches of 4."""
    client = _numbered_client(9, local_steps=3, **{"fedmdcg.batch_order": "cycled"})
    batches = _visits(client, 1)
    assert [len(b) for b in batches] == [4, 4, 4] and batches[2] == batches[0]


def test_a_restored_client_goes_on_with_the_cycle_where_it_stopped():
    """Two steps a round through batches of 4, 4 and 2: round 1 stops inside the pass, and a client
    restored from its state reads round 2 from the third batch, as one that never stopped."""
    cycled = {"local_steps": 2, "fedmdcg.batch_order": "cycled"}
    straight = _numbered_client(10, **cycled)
    expected = [_visits(straight, r) for r in (1, 2)]
    before = _numbered_client(10, **cycled)
    assert _visits(before, 1) == expected[0] and before.state_dict()["cycle_position"] == 2
    after = _numbered_client(10, **cycled)
    after.load_state_dict(before.state_dict())
    assert _visits(after, 2) == expected[1]


def test_shuffled_batches_draw_a_new_order_each_round_by_default():
    assert FedMDCGOptions().batch_order == "shuffled"
    client = _numbered_client(12, local_steps=3)
    first, second = (_flat(_visits(client, r)) for r in (1, 2))
    assert sorted(first) == sorted(second) == list(range(12)) and first != second


def test_a_run_resumed_from_its_checkpoint_goes_on_with_the_cycle(tmp_path):
    """Crash in round 3 and resume: the same metrics as an uninterrupted run, so the checkpoint kept
    each client's place in its cycle (not at a pass boundary, or the test would not see it)."""
    config = _config(algorithm="fedmdcg", **{"fedmdcg.batch_order": "cycled"})
    resumed = check_resume_after_crash(config, FedMDCGServer, tmp_path)
    state = read_checkpoint(latest_checkpoint(resumed / "checkpoints"))
    assert any(part["cycle_position"] > 0 for name, part in state.items() if name.startswith("client_"))


@pytest.mark.parametrize(
    "key, value, accepted",
    [("generator_grads", "summed", "per-batch, accumulated"), ("batch_order", "random", "shuffled, cycled")],
)
def test_the_code_options_name_their_accepted_values(key, value, accepted):
    with pytest.raises(ConfigError, match=f"fedmdcg.{key} must be one of {accepted}; got '{value}'"):
        options_for(_config(**{f"fedmdcg.{key}": value}), "fedmdcg", FedMDCGOptions)


def test_each_listed_option_line_is_about_its_own_key():
    """`fedistill list --options fedmdcg` gives each key its own doc: not the section comment above it
    (lambda_kl, clear_cache) nor the second line of the key before (server_batch_size)."""
    from fedistill.reference.options import format_options

    lines = {line.split()[0]: line for line in format_options("fedmdcg").splitlines() if " = " in line}
    assert "λ1" in lines["lambda_kl"]
    assert "after each round" in lines["clear_cache"]
    assert "labels" in lines["server_batch_size"] and "shrinks" not in lines["server_batch_size"]
    assert "shrinks" in lines["server_weight_decay"]
