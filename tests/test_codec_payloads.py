"""Flower's codec refuses malformed payloads with a FederationError that names the array, before any
large allocation: what a server's receipt check turns into one site's invalid reply."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from numpy.lib import format as npy

from fedistill.errors import FederationError
from fedistill.transports.flower.codec import from_records


def _encoded(params, encoding: str = "uint8-affine") -> RecordDict:
    return RecordDict(
        {
            "logits": ArrayRecord({"z": Array(np.zeros(3, np.uint8))}),
            "logits.encodings": ConfigRecord({"z": encoding}),
            "logits.encoding-params": ConfigRecord({"z": params}),
        }
    )


@pytest.mark.parametrize("params", [["a", "b"], 3.0, [True, False]])
def test_encoding_parameters_that_are_not_numbers_are_refused_by_name(params):
    with pytest.raises(FederationError, match="logits/z"):
        from_records(_encoded(params), "train")


def test_encoding_parameters_for_an_array_sent_as_it_is_are_refused():
    content = RecordDict(
        {
            "logits": ArrayRecord({"z": Array(np.ones(2, np.float32))}),
            "logits.encoding-params": ConfigRecord({"z": [1.0]}),
        }
    )
    with pytest.raises(FederationError, match=r"logits/z.*no encoding"):
        from_records(content, "train")


def _npy(header: dict, body: bytes) -> Array:
    buffer = io.BytesIO()
    npy.write_array_header_1_0(buffer, header)
    return Array(dtype="float32", shape=(2,), stype="numpy.ndarray", data=buffer.getvalue() + body)


def test_an_array_that_declares_more_values_than_it_carries_is_refused_before_allocating():
    huge = _npy({"descr": "<f4", "fortran_order": False, "shape": (10**15,)}, b"\0" * 8)
    with pytest.raises(FederationError, match=r"logits/z.*declares 1000000000000000 values"):
        from_records(RecordDict({"logits": ArrayRecord({"z": huge})}), "train")


def test_an_array_of_pickled_objects_is_refused_by_name():
    objects = _npy({"descr": "|O", "fortran_order": False, "shape": (2,)}, b"\0" * 16)
    with pytest.raises(FederationError, match=r"logits/z.*object"):
        from_records(RecordDict({"logits": ArrayRecord({"z": objects})}), "train")


def test_raw_is_not_offered_as_a_known_wire_encoding_when_refused():
    content = RecordDict(
        {
            "logits": ArrayRecord({"z": Array(np.ones(2, np.float32))}),
            "logits.encodings": ConfigRecord({"z": "raw"}),
        }
    )
    with pytest.raises(FederationError) as error:
        from_records(content, "train")
    assert "known: raw" not in str(error.value) and "'raw'" in str(error.value)


@pytest.mark.parametrize(
    "shape", [[0.0, 1e30], [1.0] * 70], ids=["an axis beyond NumPy's", "more axes than NumPy's"]
)
def test_a_packed_mask_naming_a_shape_numpy_cannot_make_is_refused_by_name(shape):
    """`bits` carries its array's shape; one that no array can have failed at decoding with NumPy's
    ValueError, which the in-process transport does not catch."""
    content = RecordDict(
        {
            "label-masks": ArrayRecord({"m": Array(np.zeros(0 if shape[0] == 0 else 1, np.uint8))}),
            "label-masks.encodings": ConfigRecord({"m": "bits"}),
            "label-masks.encoding-params": ConfigRecord({"m": shape}),
        }
    )
    with pytest.raises(FederationError, match=r"label-masks/m: bits carries its array's shape"):
        from_records(content, "train")


def test_an_array_that_carries_bytes_past_its_values_is_refused_by_name():
    """np.save writes its header and the values, nothing after them; bytes past the values crossed the
    wire while the ledger counted only the values (and NumPy's reader ignored them)."""
    padded = _npy({"descr": "<f4", "fortran_order": False, "shape": (2,)}, b"\0" * 8 + b"hidden" * 1000)
    with pytest.raises(FederationError, match=r"logits/z.*6000 bytes past its 2 values"):
        from_records(RecordDict({"logits": ArrayRecord({"z": padded})}), "train")
    exact = _npy({"descr": "<f4", "fortran_order": False, "shape": (2,)}, b"\0" * 8)
    assert from_records(RecordDict({"logits": ArrayRecord({"z": exact})}), "train").nbytes == 8
