"""`fediod.recompute_graphs`: a site that drops its G-step graph after `query.generate` and rebuilds it for
`query.backprop` holds no graph between the two queries, and the run is the same bit for bit."""

import copy

import torch
from safetensors.torch import load_file

from algorithm_helpers import TINY_FEDIOD, fediod_parts
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.engine.rundir import read_jsonl
from fedistill.federation.ledger import Ledger
from fedistill.transports.inprocess import InProcessFleet


def _config(recompute: bool) -> RunConfig:
    layer = copy.deepcopy(TINY_FEDIOD)
    layer["fediod"]["recompute_graphs"] = recompute
    return build_config(RunConfig(), layer, {"algorithm": "fediod"})


def test_a_recomputing_site_holds_only_its_inputs_between_the_queries():
    clients, server, _ = fediod_parts(_config(True))
    fleet = InProcessFleet(clients, Ledger(None))
    server.setup(fleet)
    held = []  # what each site holds right after answering query.generate
    for client in clients.values():
        generate = client.generate

        def wrapped(message, client=client, generate=generate):
            reply = generate(message)
            held.append((client.pending, dict(client.pending_inputs)))
            return reply

        client.generate = wrapped
    server.distillation_step(fleet)
    assert held, "no site answered query.generate"
    for pending, inputs in held:
        assert pending is None and isinstance(inputs["x"], torch.Tensor)


def test_recomputing_the_graphs_changes_no_number(tmp_path):
    kept = run_suite(_config(False), tmp_path / "kept", progress=False)[0]
    recomputed = run_suite(_config(True), tmp_path / "recomputed", progress=False)[0]
    metrics = [read_jsonl(tmp_path / name / "fediod" / "metrics.jsonl") for name in ("kept", "recomputed")]
    for a, b in zip(*metrics, strict=True):
        assert {k: v for k, v in a.items() if not k.endswith("time_s")} == {
            k: v for k, v in b.items() if not k.endswith("time_s")
        }
    cached = "teachers_from_cache"  # the second run takes the first one's teachers from the stage-1 cache
    assert {k: v for k, v in kept["final"].items() if k != cached} == {
        k: v for k, v in recomputed["final"].items() if k != cached
    }
    assert kept["communication"] == recomputed["communication"]
    models = sorted((tmp_path / "kept" / "fediod" / "models").glob("*.safetensors"))
    assert [m.name for m in models] == ["generator.safetensors", "student.safetensors"]  # G and S compared
    for model in models:
        ours, theirs = load_file(model), load_file(tmp_path / "recomputed" / "fediod" / "models" / model.name)
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
