"""Messages: structure, snapshots, validation on receipt, byte accounting."""

import numpy as np
import pytest
import torch

from fedistill.errors import FederationError
from fedistill.federation.messages import (
    ArraySpec,
    Message,
    check_on_receipt,
    expect_arrays,
    state_specs,
)
from fedistill.federation.reply_spec import ReplySpec


def test_build_snapshots_and_freezes_arrays():
    weight = torch.ones(2, 3)
    message = Message.build("train", arrays={"parameters": {"w": weight}}, scalars={"config": {"round": 1}})
    weight.add_(1)  # the sender changing its tensor afterwards must not change what was sent
    assert message.array("parameters", "w").sum() == 6
    assert not message.array("parameters", "w").flags.writeable
    assert message.tensor("parameters", "w").dtype == torch.float32


def test_bytes_by_kind_counts_arrays_and_scalars():
    message = Message.build(
        "query.distill",
        arrays={"logits": {"z": np.zeros((4, 10), np.float32)}, "input-gradients": {"g": np.zeros((4, 64))}},
        scalars={"metrics": {"loss": 0.5, "name": "abc"}},
    )
    assert message.bytes_by_kind() == {"logits": 160, "input-gradients": 2048, "metrics": 8 + 3}
    assert message.nbytes == 160 + 2048 + 11


@pytest.mark.parametrize("bad_type", ["fit", "query.", "train.x-y", "evaluate.1a", "train\n", "query.x\n"])
def test_message_type_follows_flower_convention(bad_type):
    with pytest.raises(FederationError, match="is not 'train'"):
        Message.build(bad_type)


def test_unknown_kind_and_object_arrays_are_refused():
    with pytest.raises(FederationError, match="unknown content kind 'weights'"):
        Message.build("train", arrays={"weights": {"w": np.zeros(2)}})
    with pytest.raises(FederationError, match="dtype object"):
        Message.build("train", arrays={"parameters": {"w": np.array([{"a": 1}], dtype=object)}})
    with pytest.raises(FederationError, match="only bool/int/float/str"):
        Message.build("train", scalars={"config": {"x": [1, 2]}})
    with pytest.raises(TypeError, match="torch tensors or numpy arrays"):
        Message.build("train", arrays={"parameters": {"w": [1.0, 2.0]}})


def test_receipt_rejects_non_finite_values_and_oversized_payloads():
    nan = Message.build("train", arrays={"parameters": {"w": np.array([1.0, np.nan])}})
    with pytest.raises(FederationError, match="parameters/w contains NaN"):
        check_on_receipt(nan)
    inf = Message.build("train", scalars={"metrics": {"loss": float("inf")}})
    with pytest.raises(FederationError, match="metrics/loss is inf"):
        check_on_receipt(inf)
    big = Message.build("train", arrays={"parameters": {"w": np.zeros(1000, np.float32)}})
    with pytest.raises(FederationError, match="exceeds the cap of 1,000"):
        check_on_receipt(big, max_bytes=1000)
    check_on_receipt(big, max_bytes=4000)


def test_expect_arrays_checks_names_dtypes_and_shapes():
    model = torch.nn.Linear(3, 2)
    specs = state_specs(model.state_dict())
    good = Message.build("train", arrays={"parameters": model.state_dict()})
    expect_arrays(good, "parameters", specs)
    wrong_shape = Message.build(
        "train", arrays={"parameters": {"weight": torch.zeros(2, 4), "bias": torch.zeros(2)}}
    )
    with pytest.raises(
        FederationError, match=r"parameters/weight is float32\[2, 4\], expected float32\[2, 3\]"
    ):
        expect_arrays(wrong_shape, "parameters", specs)
    wrong_dtype = Message.build(
        "train",
        arrays={"parameters": {"weight": torch.zeros(2, 3, dtype=torch.float64), "bias": torch.zeros(2)}},
    )
    with pytest.raises(FederationError, match="float64"):
        expect_arrays(wrong_dtype, "parameters", specs)
    missing = Message.build("train", arrays={"parameters": {"weight": torch.zeros(2, 3)}})
    with pytest.raises(FederationError, match=r"missing parameters arrays \['bias'\]"):
        expect_arrays(missing, "parameters", specs)
    extra = Message.build("train", arrays={"parameters": {**model.state_dict(), "evil": torch.zeros(1)}})
    with pytest.raises(FederationError, match="unexpected parameters arrays"):
        expect_arrays(extra, "parameters", specs)


def test_array_spec_wildcard_axis():
    spec = ArraySpec("float32", (None, 10))
    assert spec.matches(np.zeros((7, 10), np.float32))
    assert not spec.matches(np.zeros((7, 9), np.float32))
    assert not spec.matches(np.zeros((7, 10), np.float64))


def test_an_array_in_another_byte_order_is_kept_as_its_values_in_native_order():
    message = Message.build("train", arrays={"parameters": {"w": np.arange(4, dtype=">f4")}})
    got = message.array("parameters", "w")
    assert got.dtype == np.float32 and got.dtype.isnative
    assert torch.equal(message.tensor("parameters", "w"), torch.arange(4, dtype=torch.float32))


def test_a_whole_number_beyond_64_bits_is_refused_not_an_overflow_in_the_receiver():
    """Flower carries 64-bit integers; a larger one (in-process) made the reply checks raise OverflowError."""
    from fedistill.federation.reply_spec import TRAIN_METRICS, ReplySpec

    with pytest.raises(FederationError, match="scalar metrics/num_samples is beyond 64-bit integers"):
        Message.build("train", scalars={"metrics": {"num_samples": 10**400}})
    sent = Message(type="train", scalars={"metrics": {"num_samples": -(2**63) - 1}})  # as a client built it
    with pytest.raises(FederationError, match="beyond 64-bit integers"):
        check_on_receipt(sent)
    largest = Message.build("train", scalars={"metrics": {"num_samples": 2**64 - 1}})
    ReplySpec(metrics=TRAIN_METRICS).check(largest)  # what Flower's uint64 carries passes


def test_a_numpy_bool_scalar_is_refused_naming_its_numpy_type():
    """NumPy 2 calls its bool type `bool`, so the refusal read "is bool; only bool/int/float/str"."""
    with pytest.raises(FederationError, match=r"metrics/flag is numpy\.bool; only bool/int/float/str"):
        Message.build("train", scalars={"metrics": {"flag": np.bool_(True)}})


def test_joined_reply_specs_expect_the_arrays_of_both_under_a_shared_kind():
    """`a | b` kept only b's arrays of a kind both name, so a reply carrying a's was refused as unexpected."""
    spec = ArraySpec("float32", (3,))
    joined = ReplySpec({"logits": {"z": spec}}) | ReplySpec({"logits": {"w": spec}}, metrics=("n",))
    both = {"z": np.zeros(3, np.float32), "w": np.ones(3, np.float32)}
    joined.check(Message.build("train", arrays={"logits": both}, scalars={"metrics": {"n": 1}}))
    with pytest.raises(FederationError, match=r"missing logits arrays \['z'\]"):
        joined.check(
            Message.build("train", arrays={"logits": {"w": both["w"]}}, scalars={"metrics": {"n": 1}})
        )


@pytest.mark.parametrize(
    "payload",
    [{"arrays": {"logits": np.ones(3)}}, {"scalars": {"metrics": 3}}, {"scalars": {"metrics": "abc"}}],
    ids=["an array", "a number", "a string"],
)
def test_a_kind_given_a_value_instead_of_named_values_is_refused_by_name(payload):
    """A kind maps names to values; one mapped to the value itself failed with an AttributeError, a
    TypeError or a ValueError about dictionary update sequences."""
    with pytest.raises(FederationError, match=r"train: .* must map names to values, got"):
        Message.build("train", **payload)


@pytest.mark.parametrize(
    "payload, named",
    [
        ({"arrays": {"logits": {0: np.ones(3, np.float32)}}}, "logits/0: a name is int, not text"),
        ({"scalars": {"metrics": {1: 2.0}}}, "metrics/1: a name is int, not text"),
        ({"scalars": {"metrics": {"reason": "bad \udcff file"}}}, "scalar metrics/reason is not UTF-8 text"),
        ({"arrays": {"logits": {"z\udcff": np.ones(3, np.float32)}}}, "is not UTF-8 text"),
    ],
    ids=["an array named by a number", "a scalar named by a number", "a string", "a name"],
)
def test_names_and_strings_flower_cannot_carry_are_refused_in_process_too(payload, named):
    """What Flower cannot carry (a name that is no string, text that is no UTF-8, as a file name read
    with surrogate escapes) is refused where the message is built, so a run behaves alike on both
    transports: such a message passed in-process, and a client's reply then stopped the server while
    the ledger counted its bytes."""
    from fedistill.federation.client import ClientLogic, handles
    from fedistill.federation.ledger import Ledger
    from fedistill.transports.inprocess import InProcessFleet

    with pytest.raises(FederationError, match=named):
        Message.build("train", **payload)

    class Careless(ClientLogic):
        @handles("query.echo")
        def echo(self, message: Message) -> Message:
            return Message("query.echo", **payload)  # built by hand, unchecked

    reply = InProcessFleet({0: Careless()}, Ledger(None)).broadcast(Message.build("query.echo"))[0]
    assert not reply.ok and named in reply.error
