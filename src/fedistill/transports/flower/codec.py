"""fedistill `Message` <-> Flower `RecordDict`, lossless and without pickle.

Each content kind's arrays become one `ArrayRecord` under the kind's name (Flower serialises
arrays with `np.save(allow_pickle=False)`); each kind's scalars one `ConfigRecord` under
`<kind>.scalars`. A transport header (`fedistill.header`, not part of the message) names the
algorithm, so one SuperNode can serve the several algorithms of a suite.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedistill.errors import FederationError
from fedistill.federation.messages import Message

HEADER = "fedistill.header"
_SCALARS = ".scalars"


def to_records(message: Message, header: dict[str, Any] | None = None) -> RecordDict:
    """A federation message as a Flower RecordDict: an ArrayRecord per kind of arrays, a ConfigRecord per kind
    of scalars, and the header if any."""
    records: dict[str, Any] = {}
    for kind, named in message.arrays.items():
        records[kind] = ArrayRecord({name: Array(_contiguous(a)) for name, a in named.items()})
    for kind, named in message.scalars.items():
        records[kind + _SCALARS] = ConfigRecord(dict(named))
    if header:
        records[HEADER] = ConfigRecord(dict(header))
    return RecordDict(records)


def from_records(content: RecordDict, message_type: str) -> Message:
    """Rebuild the message (`Message.build` re-checks its structure); the header is left out."""
    arrays: dict[str, dict[str, np.ndarray]] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for key, record in content.items():
        if key == HEADER:
            continue
        if isinstance(record, ArrayRecord):
            arrays[key] = {name: array.numpy() for name, array in record.items()}
        elif isinstance(record, ConfigRecord) and key.endswith(_SCALARS):
            scalars[key.removesuffix(_SCALARS)] = dict(record)
        else:
            raise FederationError(f"{message_type}: unexpected record {key!r} ({type(record).__name__})")
    return Message.build(message_type, arrays=arrays, scalars=scalars)


def header_of(content: RecordDict) -> dict[str, Any]:
    """The header a RecordDict carries; empty without one."""
    record = content.get(HEADER)
    return dict(record) if isinstance(record, ConfigRecord) else {}


def _contiguous(array: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array (e.g. BatchNorm's step counter) into shape (1,)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)
