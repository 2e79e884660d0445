"""fedistill `Message` <-> Flower `RecordDict`, lossless and without pickle.

Each content kind's arrays become one `ArrayRecord` under the kind's name (Flower serialises
arrays with `np.save(allow_pickle=False)`); each kind's scalars one `ConfigRecord` under
`<kind>.scalars`. An array in a wire encoding (federation/encodings.py) goes as its wire array, with
its encoding under `<kind>.encodings` and its per-tensor numbers under `<kind>.encoding-params`, so
Flower carries exactly the bytes the ledger counts and the receiver decodes them as in-process. A
transport header (`fedistill.header`, not part of the message, on requests only) names the
algorithm, so one SuperNode can serve the several algorithms of a suite.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from numpy.lib import format as npy

from fedistill.errors import FederationError
from fedistill.federation.encodings import Encoded
from fedistill.federation.messages import Message, native

HEADER = "fedistill.header"
_SCALARS = ".scalars"
_ENCODINGS = ".encodings"
_PARAMS = ".encoding-params"


def to_records(message: Message, header: dict[str, Any] | None = None) -> RecordDict:
    """A federation message as a Flower RecordDict: an ArrayRecord per kind of arrays, a ConfigRecord per kind
    of scalars, and the header if any."""
    records: dict[str, Any] = {}
    for kind, named in message.arrays.items():
        records[kind] = ArrayRecord({name: Array(_contiguous(_wire(a))) for name, a in named.items()})
        encoded = {name: a for name, a in named.items() if isinstance(a, Encoded)}
        if encoded:
            records[kind + _ENCODINGS] = ConfigRecord({name: a.encoding for name, a in encoded.items()})
            params = {name: list(a.params) for name, a in encoded.items() if a.params}
            if params:
                records[kind + _PARAMS] = ConfigRecord(params)
    for kind, named in message.scalars.items():
        records[kind + _SCALARS] = ConfigRecord(dict(named))
    if header:
        records[HEADER] = ConfigRecord(dict(header))
    return RecordDict(records)


def from_records(content: RecordDict, message_type: str, *, reply: bool = False) -> Message:
    """Rebuild the message (`Message.build` re-checks its structure); the header is left out. Only a
    request carries one: a `reply` that does is refused, since what it held would cross uncounted."""
    arrays: dict[str, dict[str, np.ndarray | Encoded]] = {}
    scalars: dict[str, dict[str, Any]] = {}
    encodings: dict[str, dict[str, Any]] = {}
    params: dict[str, dict[str, Any]] = {}
    for key, record in content.items():
        if key == HEADER:
            if reply:
                raise FederationError(f"{message_type}: a reply carries a transport header ({HEADER!r})")
            continue
        if isinstance(record, ArrayRecord):
            # plain arrays reach native byte order in Message.build (_as_array); encoded ones below
            arrays[key] = {
                name: _numpy(array, f"{message_type}: {key}/{name}") for name, array in record.items()
            }
        elif isinstance(record, ConfigRecord) and key.endswith(_SCALARS):
            scalars[key.removesuffix(_SCALARS)] = dict(record)
        elif isinstance(record, ConfigRecord) and key.endswith(_ENCODINGS):
            encodings[key.removesuffix(_ENCODINGS)] = dict(record)
        elif isinstance(record, ConfigRecord) and key.endswith(_PARAMS):
            params[key.removesuffix(_PARAMS)] = dict(record)
        else:
            raise FederationError(f"{message_type}: unexpected record {key!r} ({type(record).__name__})")
    for kind, named in params.items():
        for name in named:
            if name not in encodings.get(kind, {}):
                raise FederationError(
                    f"{message_type}: encoding parameters for {kind}/{name}, which has no encoding"
                )
    for kind, named in encodings.items():
        for name, encoding in named.items():
            if name not in arrays.get(kind, {}):
                raise FederationError(f"{message_type}: encoding for {kind}/{name}, which has no array")
            numbers = _numbers(params.get(kind, {}).get(name, []), f"{message_type}: {kind}/{name}")
            arrays[kind][name] = Encoded(str(encoding), native(arrays[kind][name]), numbers)
    return Message.build(message_type, arrays=arrays, scalars=scalars)


def _numpy(array: Array, where: str) -> np.ndarray:
    """The NumPy array a Flower `Array` carries, its `.npy` header checked first: NumPy's loader allocates
    the shape a header declares before it reads a byte, so a hostile or corrupt one would ask for any amount
    of memory, and an object array would fail deep inside NumPy instead of naming the array. Bytes past
    the values are refused too: NumPy ignores them, so they would cross without the ledger counting them."""
    try:
        buffer = io.BytesIO(array.data)
        version = npy.read_magic(buffer)
        read_header = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}.get(version)
        if read_header is None:
            raise ValueError(f".npy format version {version} (np.save writes 1.0 or 2.0)")
        shape, _, dtype = read_header(buffer)  # the header only, no array
    except Exception as exc:
        raise FederationError(f"{where}: not a NumPy array ({type(exc).__name__}: {exc})") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise FederationError(
            f"{where}: an array of dtype {dtype} ({'object' if dtype.hasobject else 'empty'})"
        )
    carried, values = len(array.data) - buffer.tell(), math.prod(shape)
    if values * dtype.itemsize > carried:
        raise FederationError(
            f"{where}: declares {values} values of {dtype} in shape {list(shape)}, "
            f"but carries only {carried} bytes"
        )
    if carried > values * dtype.itemsize:  # np.save writes nothing after them; the ledger counts the values
        raise FederationError(
            f"{where}: carries {carried - values * dtype.itemsize} bytes past its {values} values"
        )
    try:
        return array.numpy()
    except Exception as exc:
        raise FederationError(f"{where}: unreadable array ({type(exc).__name__}: {exc})") from None


def _numbers(values: Any, where: str) -> tuple[float, ...]:
    """An encoded array's per-tensor numbers as floats; FederationError for anything but a list of numbers."""
    if not isinstance(values, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values
    ):
        raise FederationError(f"{where}: encoding parameters must be a list of numbers, got {values!r}")
    return tuple(float(v) for v in values)


def header_of(content: RecordDict) -> dict[str, Any]:
    """The header a RecordDict carries; empty without one."""
    record = content.get(HEADER)
    return dict(record) if isinstance(record, ConfigRecord) else {}


def _wire(value: np.ndarray | Encoded) -> np.ndarray:
    return value.data if isinstance(value, Encoded) else value


def _contiguous(array: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array (e.g. BatchNorm's step counter) into shape (1,)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)
