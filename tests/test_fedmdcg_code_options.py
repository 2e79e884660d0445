"""FedMD-CG's options that reproduce the released code's training loops: stage 2's gradients summed over
a pass of the cache (`generator_grads`), and a data order fixed once and cycled (`batches`)."""

from __future__ import annotations

import pytest
import torch

from algorithm_helpers import SMALL_NON_IID, make_client
from fedistill.algorithms.fedmdcg import losses as L
from fedistill.algorithms.fedmdcg.fedmdcg_options import FedMDCGOptions
from fedistill.config import RunConfig, build_config, options_for
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


@pytest.mark.parametrize("key, value, accepted", [("generator_grads", "summed", "per-batch, accumulated")])
def test_the_code_options_name_their_accepted_values(key, value, accepted):
    with pytest.raises(ConfigError, match=f"fedmdcg.{key} must be one of {accepted}; got '{value}'"):
        options_for(_config(**{f"fedmdcg.{key}": value}), "fedmdcg", FedMDCGOptions)
