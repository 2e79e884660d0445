"""Wire encodings: each stays within its stated error, crosses Flower's codec and the in-process transport
as the same bytes and values, lands in the ledger, and FedIOD's `wire = "compact"` moves fewer bytes."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from algorithm_helpers import TINY_FEDIOD
from fedistill.algorithms.fediod import FedIODOptions
from fedistill.algorithms.fediod import wire as wire_module
from fedistill.algorithms.fediod.wire import WIRES, wire_encodings
from fedistill.config import RunConfig, build_config, options_for
from fedistill.engine.launch import run_suite
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.encodings import Encoded, decode, encode, encoding_names
from fedistill.federation.ledger import DOWN, UP, Ledger, Totals, read_ledger
from fedistill.federation.messages import ArraySpec, Message, check_on_receipt, expect_arrays
from fedistill.federation.reply_spec import ReplySpec
from fedistill.transports.flower.codec import from_records, to_records
from fedistill.transports.inprocess import InProcessFleet


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    normal = rng.normal(size=(8, 1, 8, 8)).astype(np.float32)
    return {
        "normal": normal,
        "large": (normal * 1e6).astype(np.float32),
        "small": (normal * 1e-7).astype(np.float32),  # input-gradients of batch-mean losses
        "wide": (normal * np.logspace(-6, 3, normal.size).reshape(normal.shape)).astype(np.float32),
        "constant": np.full((4, 3), 0.7, np.float32),
        "zeros": np.zeros((2, 5), np.float32),
    }


def _bound(encoding: str, x: np.ndarray, encoded: Encoded) -> np.ndarray:
    """The largest error encodings.py states for each element of `x`."""
    size, top = np.abs(x), float(np.abs(x).max(initial=0.0))
    if encoding == "float16":
        return np.maximum(2.0**-11 * size, 2.0**-25)
    if encoding == "float16-scaled":
        return np.maximum(2.0**-11 * size, 2.0**-39 * top)
    if encoding == "bfloat16":
        return 2.0**-8 * size
    scale = encoded.params[0]  # the 8- and 16-bit grids
    if encoding == "int8-symmetric":
        return np.full(x.shape, scale / 2 + 2.0**-23 * top)
    if encoding == "int8-sqrt":
        return np.sqrt(size * top) / 127 + top / 64516 + 2.0**-23 * top
    return np.full(x.shape, scale / 2 + 2.0**-22 * top)


FLOAT_ENCODINGS = [e for e in encoding_names() if e not in ("raw", "bits")]


@pytest.mark.parametrize("encoding", FLOAT_ENCODINGS)
@pytest.mark.parametrize("name", list(_tensors()))
def test_round_trip_error_stays_within_the_stated_bound(encoding, name):
    x = _tensors()[name]
    if encoding == "float16" and name in ("large", "small", "wide"):
        pytest.skip("plain float16 is for values of known small range")
    encoded = encode(encoding, x)
    assert isinstance(encoded, Encoded) and encoded.check() is None
    decoded = decode(encoded)
    assert decoded.dtype == np.float32 and decoded.shape == x.shape
    error = np.abs(decoded.astype(np.float64) - x.astype(np.float64))
    assert (error <= _bound(encoding, x, encoded)).all(), float(error.max())
    if name == "zeros" or (name == "constant" and encoding.endswith("affine")):
        assert np.array_equal(decoded, x)  # zeros cross exactly, and any constant tensor on 8 or 16 bits
    one_byte = ("uint8-affine", "int8-symmetric", "int8-sqrt")
    assert encoded.data.nbytes == x.nbytes // (4 if encoding in one_byte else 2)


def test_int8_symmetric_keeps_zero_and_sign_where_an_offset_grid_does_not():
    """A gradient's many near-zero entries must not all move by one common error: on the symmetric grid
    they decode to zero (or their own level); on the 8-bit affine grid, whose levels start at the
    minimum, every zero entry lands on the same level next to zero."""
    x = np.zeros((4, 1, 8, 8), np.float32)
    x[0, 0, 0, 0], x[1, 0, 3, 3] = 1.0, -0.3
    symmetric = decode(encode("int8-symmetric", x))
    assert np.array_equal(symmetric == 0, x == 0) and np.array_equal(np.sign(symmetric), np.sign(x))
    affine = decode(encode("uint8-affine", x))
    zeros = affine[x == 0]
    assert (zeros == zeros[0]).all() and zeros[0] != 0  # one shared offset on 254 of the 256 entries


@pytest.mark.parametrize("encoding", FLOAT_ENCODINGS)
def test_non_finite_values_stay_non_finite_and_are_refused_on_receipt(encoding):
    x = np.array([1.0, np.nan, 3.0], np.float32)
    message = Message.build("query.generate", arrays={"logits": {"z": x}}, encodings={"logits": encoding})
    assert not np.isfinite(message.array("logits", "z")).all()
    with pytest.raises(FederationError, match="NaN or infinite"):
        check_on_receipt(message)


@pytest.mark.parametrize("shape", [(10, 64, 64), (3, 5, 7), (0, 4, 4), (9,)])
def test_bits_pack_a_two_class_mask_exactly_in_an_eighth(shape):
    """`bits`: zeros and ones at one bit each, read back exactly with their shape and uint8 dtype, through
    a message, its receipt checks and Flower's codec; a count that is not a multiple of 8 pads the last
    byte."""
    mask = (np.random.default_rng(1).random(shape) > 0.7).astype(np.uint8)
    encoded = encode("bits", mask)
    assert isinstance(encoded, Encoded) and encoded.check() is None
    assert encoded.shape == shape and encoded.dtype == np.uint8 and encoded.ndim == len(shape)
    assert encoded.data.nbytes == -(-mask.size // 8) and encoded.nbytes == encoded.data.nbytes + 8 * len(
        shape
    )
    message = Message.build(
        "query.generate", arrays={"label-masks": {"m": mask}}, encodings={"label-masks": "bits"}
    )
    back = from_records(to_records(message), "query.generate")
    check_on_receipt(back)
    expect_arrays(back, "label-masks", {"m": ArraySpec("uint8", (None, *shape[1:]))})
    decoded = back.array("label-masks", "m")
    assert decoded.dtype == np.uint8 and np.array_equal(decoded, mask)
    assert back.nbytes == message.nbytes


def test_bits_take_only_zeros_and_ones_and_refuse_a_wrong_wire_form():
    """A mask with a third class, or a float array, travels as it is under `bits`; a packed array whose
    bytes do not fit the shape it names is refused on receipt."""
    three = np.array([[0, 1], [2, 1]], np.uint8)
    masks = {"m": three, "f": three.astype(np.float32)}
    message = Message.build(
        "query.generate", arrays={"label-masks": masks}, encodings={"label-masks": "bits"}
    )
    assert all(isinstance(a, np.ndarray) for a in message.arrays["label-masks"].values())
    with pytest.raises(FederationError, match="zeros and ones"):
        encode("bits", three)
    wrong = Encoded("bits", np.zeros(3, np.uint8), (4.0, 8.0))  # 32 values need 4 bytes
    assert "do not hold shape [4, 8]" in wrong.check()
    with pytest.raises(FederationError, match="do not hold"):
        Message.build("query.generate", arrays={"label-masks": {"m": wrong}})


ENCODINGS = {"synthetic-inputs": "uint8-affine", "logits": "float16-scaled", "input-gradients": "bfloat16"}


def _message() -> Message:
    x = torch.from_numpy(_tensors()["normal"])
    return Message.build(
        "query.generate",
        arrays={
            "synthetic-inputs": {"x": x, "pair": torch.arange(8)},
            "logits": {"z": 30 * x[:, 0, 0]},
            "input-gradients": {"x": 1e-6 * x},
        },
        scalars={"config": {"step": 3}},
        encodings=ENCODINGS,
    )


def test_a_message_counts_wire_bytes_and_reads_as_float32():
    message = _message()
    # uint8 images + their scale and offset, the int64 pair as it is; float16 + a scale; bfloat16
    assert message.bytes_by_kind() == {
        "synthetic-inputs": 512 + 16 + 64,
        "logits": 64 * 2 + 8,
        "input-gradients": 512 * 2,
        "config": 8,
    }
    assert message.encodings_by_kind() == {
        "synthetic-inputs": "raw+uint8-affine",
        "logits": "float16-scaled",
        "input-gradients": "bfloat16",
    }
    assert message.tensor("synthetic-inputs", "x").dtype == torch.float32
    assert message.tensor("synthetic-inputs", "pair").dtype == torch.int64
    # the receiver's spec describes the decoded array
    expect_arrays(message, "synthetic-inputs", {"x": ArraySpec("float32", (None, 1, 8, 8)),
                                                "pair": ArraySpec("int64", (8,))})  # fmt: skip
    ReplySpec({"logits": {"z": ArraySpec("float32", (8, 8))}}).check(message)
    with pytest.raises(FederationError, match="expected float16"):
        expect_arrays(message, "logits", {"z": ArraySpec("float16", (8, 8))})
    check_on_receipt(message)
    with pytest.raises(FederationError, match="travels as uint8"):
        Message.build("train", arrays={"logits": {"z": Encoded("uint8-affine", np.zeros(3), (1.0, 0.0))}})
    with pytest.raises(FederationError, match="unknown encoding"):
        Message.build("train", arrays={"logits": {"z": np.ones(2, np.float32)}}, encodings={"logits": "int4"})


def test_an_encoded_payload_decodes_once_through_receipt_screening_and_reading(monkeypatch):
    """The receipt check, the plausibility rules and the server all read the same decoded array: each wire
    array is decoded once, and only on an explicit read (NumPy cannot convert it behind one's back)."""
    from fedistill.federation import encodings as wire
    from fedistill.federation.plausibility import GRADIENTS, magnitude_faults, norm_faults

    decoded: list[str] = []
    for name, form in list(wire.ENCODINGS.items()):

        def counted(data, params, form=form, name=name):
            decoded.append(name)
            return form.decode(data, params)

        monkeypatch.setitem(
            wire.ENCODINGS, name, wire.WireFormat(form.wire_dtype, form.params, form.encode, counted)
        )
    rng = np.random.default_rng(0)
    replies = {
        c: Message.build(
            "query.generate",
            arrays={
                "logits": {"z": rng.normal(size=(8, 10)).astype(np.float32)},
                "input-gradients": {"x": rng.normal(size=(8, 1, 8, 8)).astype(np.float32)},
            },
            encodings={"logits": "float16-scaled", "input-gradients": "bfloat16"},
        )
        for c in range(3)
    }
    assert decoded == []  # building a message encodes; nothing reads it yet
    for message in replies.values():
        check_on_receipt(message)
    assert magnitude_faults(replies) == {} and norm_faults(replies, "input-gradients", GRADIENTS) == {}
    for message in replies.values():
        message.tensor("logits", "z"), message.tensor("input-gradients", "x")
    assert sorted(decoded) == ["bfloat16"] * 3 + ["float16-scaled"] * 3
    payload = replies[0].arrays["logits"]["z"]
    assert not hasattr(payload, "__array__") and not hasattr(payload, "astype")
    with pytest.raises(TypeError):
        np.abs(payload)


class _Echo(ClientLogic):
    """Returns what it received, re-built from its decoded values in the same encodings."""

    @handles("query.generate")
    def generate(self, message: Message) -> Message:
        arrays = {k: {n: message.array(k, n) for n in named} for k, named in message.arrays.items()}
        return Message.build(message.type, arrays=arrays, encodings=ENCODINGS)


def test_flower_and_in_process_carry_the_same_bytes_and_values():
    message = _message()
    records = to_records(message)
    # Flower carries the wire arrays themselves, as raw bytes with their dtype and shape
    images = records["synthetic-inputs"]
    assert isinstance(images, ArrayRecord)
    assert images["x"].dtype == "uint8" and tuple(images["x"].shape) == (8, 1, 8, 8)
    assert images["x"].numpy().tobytes() == message.arrays["synthetic-inputs"]["x"].data.tobytes()
    received = from_records(records, message.type)
    assert received.bytes_by_kind() == message.bytes_by_kind()
    assert received.encodings_by_kind() == message.encodings_by_kind()
    for kind, named in message.arrays.items():
        for name in named:
            assert np.array_equal(received.array(kind, name), message.array(kind, name))
    # in-process: the same message, the same ledger bytes, and the client reads the same values
    ledger = Ledger()
    fleet = InProcessFleet({0: _Echo()}, ledger)
    reply = fleet.send({0: message})[0]
    assert reply.ok
    down = {k: v for (d, _, k), v in ledger.totals.bytes.items() if d == DOWN}
    assert down == message.bytes_by_kind()
    up = {k: v for (d, _, k), v in ledger.totals.bytes.items() if d == UP}
    assert up == {k: v for k, v in message.bytes_by_kind().items() if k != "config"}
    assert np.array_equal(reply.message.array("logits", "z"), received.array("logits", "z"))
    # decoding then encoding again gives the same wire bytes
    assert reply.message.arrays["synthetic-inputs"]["x"].data.tobytes() == images["x"].numpy().tobytes()


def test_the_ledger_records_encodings_per_kind_and_reads_old_records(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    ledger.record(round=1, step=0, direction=DOWN, client=0, message=_message(), type="query.generate")
    plain = Message.build("train", arrays={"logits": {"z": np.ones(3, np.float32)}})
    ledger.record(round=1, step=0, direction=UP, client=0, message=plain, type="train")
    ledger.close()
    first, second = read_ledger(path)
    assert first["encodings"]["logits"] == "float16-scaled" and first["bytes"] == _message().nbytes
    assert "encodings" not in second  # a message sent as built: the record as before
    summary = ledger.totals.summary()
    assert summary[DOWN]["encodings"]["synthetic-inputs"] == "raw+uint8-affine"
    assert "encodings" not in summary[UP]
    old = {"direction": UP, "client": 0, "kinds": {"logits": 12}, "status": "ok"}  # written before encodings
    totals = Totals()
    totals.add(json.loads(json.dumps(old)))
    assert totals.summary()[UP]["per_kind"] == {"logits": 12}


def test_fediod_wire_is_checked():
    assert options_for(build_config(RunConfig(), {}), "fediod", FedIODOptions).wire == "compact"
    with pytest.raises(ConfigError, match="wire"):
        options_for(build_config(RunConfig(), {"fediod.wire": "int4"}), "fediod", FedIODOptions)


def _run(tmp_path, wire: str) -> tuple[dict, list[dict]]:
    layer = copy.deepcopy(TINY_FEDIOD)
    layer["rounds"] = 1
    layer["fediod"]["wire"] = wire
    config = build_config(RunConfig(), layer, {"algorithm": "fediod"})
    summary = run_suite(config, tmp_path / wire, progress=False)[0]
    return summary, read_ledger(tmp_path / wire / "fediod" / "ledger.jsonl")


def test_compact_fediod_moves_fewer_bytes_and_learns_alike(tmp_path):
    plain, plain_ledger = _run(tmp_path, "float32")
    compact, compact_ledger = _run(tmp_path, "compact")
    assert not any("encodings" in r for r in plain_ledger)
    assert [r["type"] for r in compact_ledger] == [r["type"] for r in plain_ledger]  # the same protocol
    for record in compact_ledger:
        expected = {
            ("query.generate", DOWN): {"synthetic-inputs": "uint8-affine"},
            ("query.student", DOWN): {"synthetic-inputs": "uint8-affine"},
            ("query.backprop", DOWN): {"output-gradients": "float16-scaled"},
            ("query.generate", UP): {"logits": "float16-scaled", "discriminator-outputs": "float16-scaled"},
            ("query.student", UP): {"logits": "float16-scaled", "discriminator-outputs": "float16-scaled"},
            ("query.backprop", UP): {"input-gradients": "float16-scaled"},
            ("evaluate.student", DOWN): {"parameters": "float16-scaled+raw"},  # batch norm's counters raw
            ("evaluate.teachers", UP): {"logits": "float16-scaled"},
        }.get((record["type"], record["direction"]), {})
        if record["status"] == "ok":
            assert record.get("encodings", {}) == expected, record
    ratio = {}
    for direction in (UP, DOWN):
        before = plain["communication"][direction]["per_kind"]
        after = compact["communication"][direction]["per_kind"]
        ratio |= {kind: after[kind] / before[kind] for kind in before}
    # 1 byte instead of 4 (and 2 instead of 4) per value, plus 16 (8) bytes of scale and offset per tensor
    assert 0.25 < ratio["synthetic-inputs"] < 0.26
    for kind in ("input-gradients", "output-gradients"):
        assert 0.5 < ratio[kind] < 0.52
    assert 0.5 < ratio["discriminator-outputs"] < 0.65  # (B,) ratios: the scale weighs more
    assert 0.5 < ratio["parameters"] < 0.52  # the student the sites validate, at two bytes a value
    for kind in ("label-statistics", "config", "metrics"):
        assert ratio[kind] == 1.0  # stage 1's counts and the scalars travel as they are
    assert compact["communication"][UP]["encodings"]["input-gradients"] == "float16-scaled"
    # the same teachers; their test outputs through float16 may move an argmax tie, no more
    assert abs(compact["final"]["ensemble_accuracy"] - plain["final"]["ensemble_accuracy"]) <= 0.01
    assert abs(compact["test_accuracy"] - plain["test_accuracy"]) < 0.1


def test_evaluation_in_float16_changes_the_bytes_not_the_run(tmp_path, monkeypatch):
    """The student the sites validate and the teachers' test outputs travel as float16 under `compact`:
    half the bytes, and the same run. Training never reads them, so every epoch's student and test score
    are the same as with evaluation sent as it is, and each validation score moves by at most one
    validation sample."""
    compact, compact_ledger = _run(tmp_path, "compact")
    monkeypatch.setattr(wire_module, "EVALUATION", {})
    (tmp_path / "exact").mkdir()
    exact, exact_ledger = _run(tmp_path / "exact", "compact")

    def evaluation(ledger: list[dict]) -> list[dict]:
        return [
            r.get("encodings", {}) for r in ledger if r["type"].startswith("evaluate.") and r["bytes"] > 64
        ]

    assert evaluation(exact_ledger) and not any(evaluation(exact_ledger))
    sent = {"float16-scaled", "float16-scaled+raw"}  # batch norm's integer counters go as they are
    assert all(e and set(e.values()) <= sent for e in evaluation(compact_ledger))
    rows = {name: [json.loads(line) for line in (root / "compact" / "fediod" / "metrics.jsonl").open()]
            for name, root in (("half", tmp_path), ("exact", tmp_path / "exact"))}  # fmt: skip
    assert [r["test_accuracy"] for r in rows["half"]] == [r["test_accuracy"] for r in rows["exact"]]
    partition = json.loads((tmp_path / "compact" / "fediod" / "partition.json").read_text())
    val_count = sum(partition["client_val_sizes"])
    for half, exact_row in zip(rows["half"], rows["exact"], strict=True):
        assert abs(half["val_accuracy"] - exact_row["val_accuracy"]) <= 1 / val_count + 1e-12
    down = {name: s["communication"][DOWN]["per_kind"]["parameters"] for name, s in
            (("half", compact), ("exact", exact))}  # fmt: skip
    assert 0.5 < down["half"] / down["exact"] < 0.52
    assert abs(compact["final"]["ensemble_accuracy"] - exact["final"]["ensemble_accuracy"]) <= 0.01


def test_compact8_sends_the_sites_logits_and_input_gradients_in_one_byte(tmp_path):
    """`wire = "compact8"`: the two kinds the sites send most of at one byte a value, the rest as compact;
    the same protocol and teachers, and a student alike (the digits demo's paired seeds:
    benchmarks/results/fediod_wire_encodings_compact-compact8.md)."""
    compact, compact_ledger = _run(tmp_path, "compact")
    eight, eight_ledger = _run(tmp_path, "compact8")
    assert [r["type"] for r in eight_ledger] == [r["type"] for r in compact_ledger]
    kinds = {k: v for r in eight_ledger if r["status"] == "ok" for k, v in r.get("encodings", {}).items()}
    assert kinds == {"synthetic-inputs": "uint8-affine", "logits": "int8-symmetric",
                     "input-gradients": "int8-symmetric", "output-gradients": "float16-scaled",
                     "discriminator-outputs": "float16-scaled",
                     "parameters": "float16-scaled+raw"}  # fmt: skip
    before, after = compact["communication"][UP]["per_kind"], eight["communication"][UP]["per_kind"]
    # 1 byte a value instead of 2
    assert 0.5 < after["input-gradients"] / before["input-gradients"] < 0.52
    stage2 = [(a, b) for a, b in zip(eight_ledger, compact_ledger, strict=True)
              if a["type"] in ("query.generate", "query.student") and a["direction"] == UP]  # fmt: skip
    logits = [a["kinds"]["logits"] / b["kinds"]["logits"] for a, b in stage2 if a["status"] == "ok"]
    assert logits and all(0.5 < r < 0.55 for r in logits)
    assert after["discriminator-outputs"] == before["discriminator-outputs"]
    assert eight["final"]["ensemble_accuracy"] == compact["final"]["ensemble_accuracy"]
    assert abs(eight["test_accuracy"] - compact["test_accuracy"]) < 0.1


def test_each_fediod_wire_names_its_encodings_per_kind():
    assert wire_encodings("float32") == {}
    compact = wire_encodings("compact")
    assert wire_encodings("compact8") == compact | {
        "logits": "int8-symmetric",
        "input-gradients": "int8-symmetric",
    }
    assert wire_encodings("compact8-gradients") == compact | {"input-gradients": "int8-symmetric"}
    assert wire_encodings("compact8-sqrt") == wire_encodings("compact8") | {"logits": "int8-sqrt"}
    assert all(set(wire_encodings(w).values()) <= set(encoding_names()) for w in WIRES)
    # evaluation (the validation copy of the student, the teachers' test outputs): float16 but on float32
    assert wire_module.evaluation_encodings("float32") == {}
    for wire in set(WIRES) - {"float32"}:
        assert wire_module.evaluation_encodings(wire) == {
            "parameters": "float16-scaled",
            "logits": "float16-scaled",
        }


def test_int8_sqrt_steps_finest_near_zero():
    """A margin map's boundary pixels (near zero) keep finer steps on the square-root grid than on the
    linear one, when a confident background sets the range."""
    x = np.concatenate([np.full(50, -40.0), np.linspace(-2, 2, 41)]).astype(np.float32)
    near = np.abs(x) <= 2
    linear = np.abs(decode(encode("int8-symmetric", x)) - x)[near].max()
    root = np.abs(decode(encode("int8-sqrt", x)) - x)[near].max()
    assert root < linear / 2 and linear > 0.1  # 40 / 254 = 0.157 on the linear grid


def test_compact_fediod_over_a_flower_grid_matches_in_process(tmp_path):
    """Flower's codec carries the encoded arrays: the same ledger records, encodings included, and the same
    student."""
    from fedistill.engine.flower.apps import make_client_app
    from flower_local_grid import LocalGrid, run_on_grid

    here, here_ledger = _run(tmp_path, "compact")
    config = build_config(RunConfig(), {**copy.deepcopy(TINY_FEDIOD), "rounds": 1}, {"algorithm": "fediod"})
    config = build_config(config, {"fediod.wire": "compact"})
    grid = LocalGrid(make_client_app(config, state_root=tmp_path / "nodes"), config.clients)
    there = run_on_grid(config, tmp_path / "flower", grid)[0]
    there_ledger = read_ledger(tmp_path / "flower" / "fediod" / "ledger.jsonl")

    def traffic(records: list[dict]) -> list[str]:  # a grid sends a round's requests before any reply
        return sorted(json.dumps([r["direction"], r["client"], r["type"], r["kinds"], r.get("encodings")])
                      for r in records if r["type"] != "query.hello")  # fmt: skip

    assert traffic(there_ledger) == traffic(here_ledger)
    assert there["transport"] == "flower"
    assert there["test_accuracy"] == pytest.approx(here["test_accuracy"], abs=1e-6)


def test_values_below_float32s_range_of_scales_decode_to_zeros_without_warnings():
    """max |x| = 1e-42: the square-root grid's scale (m / 127^2) underflowed to 0 and the encoder divided
    by it (NaN cast to int8); it now sends zeros, all a byte can tell such values from."""
    x = np.array([1e-42, -1e-42, 0.0], dtype=np.float32)
    with np.errstate(all="raise"):
        decoded = decode(encode("int8-sqrt", x))
    assert np.array_equal(decoded, np.zeros(3, np.float32))


@pytest.mark.parametrize("encoding", [*FLOAT_ENCODINGS, "bits"])
def test_a_0_d_array_keeps_its_shape_through_every_encoding(encoding):
    """A scalar tensor (a learnable temperature, a loss) crosses as shape (), not (1,), in-process and
    through Flower's codec, so the receiver's spec for it still matches."""
    x = np.array(1, np.uint8) if encoding == "bits" else np.array(2.5, np.float32)
    assert decode(encode(encoding, x)).shape == ()
    kind = "label-masks" if encoding == "bits" else "parameters"
    message = Message.build("train", arrays={kind: {"t": x}}, encodings={kind: encoding})
    back = from_records(to_records(message), "train")
    for received in (message, back):
        assert received.array(kind, "t").shape == ()
        expect_arrays(received, kind, {"t": ArraySpec(x.dtype.name, ())})
        assert float(received.array(kind, "t")) == pytest.approx(float(x), rel=2e-2)


def test_a_float16_overflow_is_named_on_receipt_and_encodes_without_a_warning():
    """Finite values past float16's 65504 become infinite on the wire, by design; the sender builds its
    message quietly, and the receiver's refusal says the values went as float16 and what to use instead,
    not only that they are infinite (they were not when sent)."""
    x = np.array([7e4, 1.0], np.float32)
    with np.errstate(all="raise"):
        message = Message.build("train", arrays={"logits": {"z": x}}, encodings={"logits": "float16"})
    with pytest.raises(FederationError, match=r"logits/z contains NaN or infinite values.*float16.*65520"):
        check_on_receipt(message)
    plain = Message.build("train", arrays={"logits": {"z": np.array([np.inf], np.float32)}})
    with pytest.raises(FederationError, match=r"infinite values$"):
        check_on_receipt(plain)


def test_an_encoded_value_whose_wire_form_is_not_an_array_is_refused_by_name():
    """Message.build froze the wire array before checking it: a list there was an AttributeError."""
    with pytest.raises(FederationError, match=r"logits/z: uint8-affine travels as uint8, got list"):
        Message.build("train", arrays={"logits": {"z": Encoded("uint8-affine", [1, 2], (1.0, 0.0))}})


def test_encodings_for_an_unknown_kind_or_by_an_unknown_name_are_refused_even_without_arrays():
    """A misspelt kind (`logit`) sent that kind's arrays as float32 without a word; a misspelt encoding
    was only noticed in messages that carried an array of its kind."""
    z = {"logits": {"z": np.ones(3, np.float32)}}
    with pytest.raises(FederationError, match=r"encodings name an unknown content kind 'logit'"):
        Message.build("train", arrays=z, encodings={"logit": "float16-scaled"})
    with pytest.raises(FederationError, match=r"unknown encoding 'float16-scaeld'"):
        Message.build("train", arrays=z, encodings={"input-gradients": "float16-scaeld"})


def test_bfloat16_keeps_float32s_range_but_its_top_half_step():
    """As encodings.py states: values up to bfloat16's largest (3.3895e38) cross within 2^-8 |x|; past
    3.3961e38 they round to infinity, which the receiver refuses."""
    x = np.array([3.3895e38, -3.3960e38, 3.3962e38, -3.4028e38], np.float32)
    decoded = decode(encode("bfloat16", x))
    assert np.isfinite(decoded[:2]).all() and (np.abs(decoded[:2] - x[:2]) <= 2.0**-8 * np.abs(x[:2])).all()
    assert np.array_equal(decoded[2:], [np.inf, -np.inf])


def test_the_edges_of_float16_and_the_affine_grids_are_where_encodings_py_states():
    """float16 rounds values up to half a step past its largest (65504) down to it, and turns 65520 on into
    infinities; an affine grid over a range beyond float32's largest decodes its top to infinity, which the
    receiver refuses, naming the encoding."""
    x = np.array([65504.0, 65519.0, -65519.0, 65520.0, -1e5], np.float32)
    assert decode(encode("float16", x)).tolist() == [65504.0, 65504.0, -65504.0, np.inf, -np.inf]
    wide = np.array([-2e38, 0.0, 2e38], np.float32)
    for encoding in ("uint8-affine", "uint16-affine"):
        with np.errstate(over="ignore"):
            message = Message.build("train", arrays={"logits": {"z": wide}}, encodings={"logits": encoding})
            decoded = message.array("logits", "z")
        assert np.isfinite(decoded[:2]).all() and decoded[2] == np.inf
        with pytest.raises(FederationError, match=f"infinite values \\(sent as {encoding}\\)"):
            check_on_receipt(message)


@pytest.mark.parametrize("encoding", FLOAT_ENCODINGS)
def test_round_trip_error_near_float32s_smallest_numbers_stays_within_the_stated_bound(encoding):
    """Below 2^-126 float32 resolves only multiples of 2^-149: bfloat16 then keeps fewer digits and the
    grids' scales round to those steps, as encodings.py states (2^-134, and L 2^-150 on top)."""
    levels = {"uint8-affine": 255, "uint16-affine": 65535, "int8-symmetric": 127, "int8-sqrt": 127**2}
    rng = np.random.default_rng(3)
    for magnitude in 10.0 ** np.arange(-44.0, -30.0):
        for x in (rng.normal(size=32) * magnitude, rng.normal(size=32) * magnitude * 1e-3 + magnitude):
            x = x.astype(np.float32)
            encoded = encode(encoding, x)
            bound = _bound(encoding, x.astype(np.float64), encoded)
            if encoding == "bfloat16":
                bound = np.maximum(bound, 2.0**-134)
            bound = bound + levels.get(encoding, 0) * 2.0**-150
            error = np.abs(decode(encoded).astype(np.float64) - x.astype(np.float64))
            assert (error <= bound).all(), (magnitude, float((error - bound).max()))


def test_a_nan_sent_as_float16_is_not_blamed_on_float16s_range():
    """float16 turns large finite values into infinities, never into NaN: a NaN came from the sender, and
    the refusal's advice to switch to float16-scaled would not have helped."""
    nan = np.array([np.nan, 1.0], np.float32)
    message = Message.build("train", arrays={"logits": {"z": nan}}, encodings={"logits": "float16"})
    with pytest.raises(FederationError, match=r"NaN or infinite values \(sent as float16\)$"):
        check_on_receipt(message)
