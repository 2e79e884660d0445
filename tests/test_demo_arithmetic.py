"""The demo's arithmetic count (benchmarks/demo_arithmetic.py): a layer's operations by the textbook formula,
forward and backward, including through `torch.autograd.grad` on a leaf (FedIOD's server step), and a
client's work counted under the request it answers."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import demo_arithmetic as arithmetic  # noqa: E402
from fedistill.federation.client import ClientLogic, handles  # noqa: E402
from fedistill.federation.messages import Message  # noqa: E402


def test_a_linear_layer_costs_two_operations_per_multiply_add_and_backward_only_what_is_asked():
    layer, x = nn.Linear(5, 3, bias=False), torch.randn(4, 5, requires_grad=True)
    forward = 2 * 4 * 5 * 3
    count = arithmetic.OperationCount()
    with count:
        layer(x).sum().backward()  # dL/dx and dL/dW: two products the size of the forward one
    assert count.counts == {"server": 3 * forward}
    assert set(count.seconds) == {"server"} and count.seconds["server"] > 0  # the products' own time
    count = arithmetic.OperationCount()
    with count:
        (grad_x,) = torch.autograd.grad(layer(x).sum(), [x])  # a leaf, as FedIOD's server asks: dL/dx only
    assert count.counts == {"server": 2 * forward}
    assert torch.allclose(grad_x, layer.weight.sum(0).expand(4, 5))


def test_a_convolution_is_counted_per_output_pixel():
    conv, x = nn.Conv2d(2, 4, 3, padding=1, bias=False), torch.randn(1, 2, 6, 6)
    count = arithmetic.OperationCount()
    with count, torch.no_grad():
        conv(x)
    assert count.counts["server"] == 2 * (6 * 6) * 4 * (2 * 3 * 3)


class Squarer(ClientLogic):
    layer = nn.Linear(2, 2, bias=False)

    @handles("query.square")
    def square(self, message: Message) -> Message:
        self.layer(torch.ones(1, 2))
        return Message.build("query.square")


def test_what_a_client_computes_counts_under_the_request_it_answers():
    count = arithmetic.OperationCount()
    with count, arithmetic.per_request(count), torch.no_grad():
        Squarer().handle(Message.build("query.square"))
        nn.Linear(3, 1, bias=False)(torch.ones(1, 3))  # the server's own
    assert dict(count.counts) == {"query.square": 2 * 2 * 2, "server": 2 * 3}
    assert ClientLogic.handle.__name__ == "handle" and count.bucket == "server"


def test_the_servers_generator_is_told_apart_from_its_other_models_forward_and_backward():
    from fedistill.data.base import DatasetInfo
    from fedistill.models.generator import build_generator

    info = DatasetInfo("digits", 1, 8, 10, (0.5,), (0.3,))
    count = arithmetic.OperationCount()
    generator = build_generator(info, width=4, upsamples=1)
    student = nn.Linear(64, 10, bias=False)
    with count, arithmetic.generators_known(count):
        x = generator(torch.randn(2, 100))
        student(x.flatten(1)).sum().backward()
    student_part = 3 * (2 * 2 * 64 * 10)  # forward, dL/dx into G, dL/dW
    assert count.counts["server"] == student_part
    alone = arithmetic.OperationCount()
    with alone:
        generator(torch.randn(2, 100)).sum().backward()
    assert count.counts["generator"] == alone.counts["server"] > 0


def test_two_generator_graphs_alive_at_once_hand_the_count_back_to_the_server():
    from fedistill.data.base import DatasetInfo
    from fedistill.models.generator import build_generator

    generator = build_generator(DatasetInfo("digits", 1, 8, 10, (0.5,), (0.3,)), width=4, upsamples=1)
    count = arithmetic.OperationCount()
    with count, arithmetic.generators_known(count):
        first, second = generator(torch.randn(2, 100)), generator(torch.randn(2, 100))
        second.sum().backward()
        first.sum().backward()
        nn.Linear(3, 1, bias=False)(torch.ones(1, 3))
    assert count.bucket == "server" and count.counts["server"] == 2 * 3


def test_the_matmul_rate_named_one_threads_is_measured_at_one_thread(tmp_path, monkeypatch):
    # the runs use `--threads 2`; the record's "matmul_gflops_1_thread" must still be one thread's rate
    seen = []
    import fediod_step_time

    rate = lambda: seen.append(torch.get_num_threads()) or 1.0  # noqa: E731
    monkeypatch.setattr(fediod_step_time, "matmul_peak_gflops", rate)
    fake = {"test_accuracy": 0.5, "gflop": 1.0, "gflop_sites": 0.0, "gflop_server": 1.0,
            "gflop_server_generator": 0.0, "gflop_by_request": {}}  # fmt: skip
    monkeypatch.setattr(arithmetic, "counted", lambda *args: dict(fake))
    argv = [
        "demo_arithmetic.py",
        "--methods",
        "fedavg",
        "--threads",
        "2",
        "--no-time",
        "--results",
        str(tmp_path),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    before = torch.get_num_threads()
    try:
        arithmetic.main()
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert "rate at one thread, same run: 1.0 GFLOP/s" in (tmp_path / "demo_arithmetic.md").read_text()
