"""Messages: the only thing that crosses the client/server boundary.

A message is a type name plus named numeric arrays and plain scalars, grouped by *content kind*
(parameters, logits, input-gradients, ...). Grouping by kind is what lets the ledger say exactly
what left each client, and it maps one-to-one onto Flower's RecordDict (one record per kind).
Nothing here is ever pickled: arrays are plain numeric NumPy arrays, scalars are bool/int/float/str.
A sender may name a wire encoding per kind (encodings.py): those arrays then travel smaller, are counted
at their wire size, and are decoded to float32 whenever a receiver reads them.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from fedistill import devices
from fedistill.errors import FederationError
from fedistill.federation.encodings import RAW, Encoded, decode, encode_or_keep, encoding_of, wire_format

#: What torch.from_numpy says about each read-only array of a decoded payload (receivers never write).
NOT_WRITABLE = "The given NumPy array is not writable"


def quiet_read_only_arrays() -> None:
    """Keep torch's warning about read-only arrays quiet with one filter, added only when missing (an
    enclosing `catch_warnings` may have dropped it). Not a `catch_warnings` block per array: each block
    resets the registry that shows a repeated warning once, and torch's "no deterministic implementation"
    warning (CUDA runs) then printed at every backward pass, thousands of times in one run."""
    if not any(
        f[0] == "ignore" and f[1] is not None and f[1].pattern == NOT_WRITABLE for f in warnings.filters
    ):
        warnings.filterwarnings("ignore", message=NOT_WRITABLE, category=UserWarning)


#: The transport's start-up exchange on Flower: each node names its partition (transports/flower/
#: grid_fleet.py); where sites hold their own data it carries the server's dataset facts and test set
#: (engine/site_data.py).
HELLO = "query.hello"

#: Every content kind a message may carry. The ledger summarises bytes per kind.
CONTENT_KINDS = frozenset(
    {
        "parameters",  # model weights or weight updates
        "logits",  # model outputs on some inputs
        "input-gradients",  # gradients of a loss with respect to inputs
        "output-gradients",  # gradients of a loss with respect to a model's outputs
        "synthetic-inputs",  # generated (not real) inputs
        "discriminator-outputs",  # a discriminator's scores on inputs
        "label-statistics",  # class counts or label distributions
        "public-data",  # inputs (and labels) of a public dataset, sent by the server
        "evaluation-set",  # the server's own test set, sent once to sites holding their own data (scoring)
        "votes",  # quantised model outputs: one-hot votes or few-bit probabilities (PATE-style)
        "label-masks",  # per-pixel label masks (a site's private labels when it sends them)
        "latent-features",  # a model's intermediate features of private inputs (FL-MRCM's target site)
        "activation-statistics",  # per-channel moments of a model's activations over private inputs
        "metrics",  # evaluation or training numbers
        "config",  # instructions: round, learning rate, number of steps, ...
    }
)

ALLOWED_DTYPES = frozenset(
    {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}
)
Scalar = bool | int | float | str
#: A payload value: a plain array, or a float32 array in its wire encoding.
Payload = np.ndarray | Encoded

#: The whole numbers a scalar may hold: what Flower carries (sint64, or uint64 above it). A larger Python
#: int would reach a receiver only in-process, and `float()` of it raises instead of failing the reply.
INT_RANGE = (-(2**63), 2**64 - 1)

#: The default cap on one message's payload; large models raise it in the run config.
DEFAULT_MAX_BYTES = 512 * 1024 * 1024

_TYPE_PATTERN = re.compile(r"(train|evaluate|query)(\.[A-Za-z_][A-Za-z0-9_]*)?")  # whole string: fullmatch


def native(array: np.ndarray) -> np.ndarray:
    """A C-ordered copy in this machine's byte order, the same values: a big-endian or Fortran-ordered
    array from the wire would pass every dtype check and then fail in torch.from_numpy inside the
    receiver's own code."""
    return np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)


def _as_array(value: np.ndarray | torch.Tensor) -> np.ndarray:
    """Snapshot a tensor or array as a read-only NumPy array owned by the message."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype == torch.bfloat16:
            value = value.float()
        array = value.cpu().numpy().copy()
    elif isinstance(value, np.ndarray):
        array = native(value)
    else:
        raise TypeError(f"message arrays must be torch tensors or numpy arrays, got {type(value).__name__}")
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class Message:
    """A typed request or reply. Build with `Message.build`, which snapshots and checks the payload.

    `type` follows Flower's convention: `train`, `evaluate` or `query.<action>`.
    `arrays` and `scalars` map a content kind to a dict of named values; an array is held as it crosses
    the wire (an `Encoded` value when its kind was sent with an encoding), so read it with `array`.
    """

    type: str
    arrays: Mapping[str, Mapping[str, Payload]] = field(default_factory=dict)
    scalars: Mapping[str, Mapping[str, Scalar]] = field(default_factory=dict)

    @staticmethod
    def build(
        type: str,
        arrays: Mapping[str, Mapping[str, np.ndarray | torch.Tensor | Encoded]] | None = None,
        scalars: Mapping[str, Mapping[str, Scalar]] | None = None,
        encodings: Mapping[str, str] | None = None,
    ) -> Message:
        """A message with its arrays copied into read-only NumPy arrays and its structure checked.

        `encodings` names a wire encoding per content kind (encodings.py) for that kind's arrays that
        it takes (float32; `bits`: uint8 zeros and ones); other arrays, and values already encoded, are
        kept as they are."""
        wire = dict(encodings or {})
        for kind, encoding in wire.items():  # a misspelt one would send its kind's arrays as they are
            if kind not in CONTENT_KINDS:
                raise FederationError(
                    f"{type}: encodings name an unknown content kind {kind!r}; known: {sorted(CONTENT_KINDS)}"
                )
            wire_format(encoding)
        _check_mappings(type, arrays or {}, scalars or {})
        message = Message(
            type=type,
            arrays={
                kind: {name: _payload(v, wire.get(kind, RAW)) for name, v in named.items()}
                for kind, named in (arrays or {}).items()
            },
            scalars={kind: dict(named) for kind, named in (scalars or {}).items()},
        )
        check_structure(message)
        return message

    # --- reading -----------------------------------------------------------------------------
    def array(self, kind: str, name: str) -> np.ndarray:
        """The array `name` of content kind `kind`, decoded from its wire encoding if it has one;
        FederationError when the message lacks it."""
        try:
            return decode(self.arrays[kind][name])
        except KeyError:
            raise FederationError(f"message {self.type!r} has no array {kind}/{name}") from None

    def tensor(self, kind: str, name: str) -> torch.Tensor:
        """The array as a tensor on the run's device (on the CPU it shares memory with the decoded payload).
        Receivers must not modify it in place."""
        quiet_read_only_arrays()
        return devices.on_device(torch.from_numpy(self.array(kind, name)))

    def tensors(self, kind: str) -> dict[str, torch.Tensor]:
        """Every array of content kind `kind` as a tensor on the run's device, by name."""
        return {name: self.tensor(kind, name) for name in self.arrays.get(kind, {})}

    def scalar(self, kind: str, name: str, default: Scalar | None = None) -> Scalar:
        """The scalar `name` of kind `kind`, else `default`; FederationError when neither exists."""
        value = self.scalars.get(kind, {}).get(name, default)
        if value is None:
            raise FederationError(f"message {self.type!r} has no scalar {kind}/{name}")
        return value

    # --- accounting --------------------------------------------------------------------------
    def bytes_by_kind(self) -> dict[str, int]:
        """Payload bytes per content kind: array bytes plus 8 bytes per number and UTF-8 length of strings."""
        sizes: dict[str, int] = {}
        for kind, named in self.arrays.items():
            sizes[kind] = sizes.get(kind, 0) + sum(int(a.nbytes) for a in named.values())
        for kind, named in self.scalars.items():
            sizes[kind] = sizes.get(kind, 0) + sum(_scalar_bytes(v) for v in named.values())
        return sizes

    @property
    def nbytes(self) -> int:
        """The payload's size in bytes, every content kind together (what the ledger records)."""
        return sum(self.bytes_by_kind().values())

    def encodings_by_kind(self) -> dict[str, str]:
        """The wire encodings of each content kind that has an encoded array, `+`-joined when its arrays
        differ (`raw` for a plain one); empty when everything travels as built."""
        found: dict[str, set[str]] = {}
        for kind, named in self.arrays.items():
            names = {encoding_of(a) for a in named.values()}
            if names - {RAW}:
                found[kind] = names
        return {kind: "+".join(sorted(names)) for kind, names in found.items()}


def _payload(value: np.ndarray | torch.Tensor | Encoded, encoding: str) -> Payload:
    """A value as the message holds it: encoded values as they are, arrays snapshotted, and the arrays
    of a kind with an encoding that the encoding takes (float32; `bits`: uint8 zeros and ones) in it."""
    if isinstance(value, Encoded):
        if isinstance(value.data, np.ndarray):  # anything else is refused by check_structure, by name
            value.data.flags.writeable = False
        return value
    return encode_or_keep(encoding, _as_array(value))


def _scalar_bytes(value: Scalar) -> int:
    return len(value.encode("utf-8")) if isinstance(value, str) else 8


def is_message_type(text: object) -> bool:
    """Whether `text` may be a message's type: `train`, `evaluate` or `query`, optionally `.<action>`."""
    return isinstance(text, str) and _TYPE_PATTERN.fullmatch(text) is not None


def _check_mappings(message_type: str, arrays: object, scalars: object) -> None:
    """Each kind maps names to values: a message built by hand (not `Message.build`) may hold anything."""
    for what, given in (("arrays", arrays), ("scalars", scalars)):
        if not isinstance(given, Mapping):
            raise FederationError(f"{message_type}: {what} must map content kinds, got {_type_name(given)}")
        for kind, named in given.items():
            if not isinstance(named, Mapping):
                got = _type_name(named)
                raise FederationError(
                    f"{message_type}: {what} of kind {kind!r} must map names to values, got {got}"
                )


def check_structure(message: Message) -> None:
    """The checks every message passes on creation and on receipt, whatever its type."""
    if not is_message_type(message.type):
        raise FederationError(f"message type {message.type!r} is not 'train', 'evaluate' or 'query.<action>'")
    _check_mappings(message.type, message.arrays, message.scalars)
    for kind, named in message.arrays.items():
        _check_kind(kind, message.type)
        for name, array in named.items():
            _check_name(message.type, kind, name)
            if isinstance(array, Encoded):
                fault = array.check()
                if fault is not None:
                    raise FederationError(f"{message.type}: {kind}/{name}: {fault}")
                continue
            if not isinstance(array, np.ndarray):
                raise FederationError(
                    f"{message.type}: {kind}/{name} is {type(array).__name__}, not an array"
                )
            if array.dtype.name not in ALLOWED_DTYPES:
                allowed = ", ".join(sorted(ALLOWED_DTYPES))
                raise FederationError(
                    f"{message.type}: {kind}/{name} has dtype {array.dtype}; allowed: {allowed}"
                )
    for kind, named in message.scalars.items():
        _check_kind(kind, message.type)
        for name, value in named.items():
            _check_name(message.type, kind, name)
            if not isinstance(value, bool | int | float | str):
                raise FederationError(
                    f"{message.type}: scalar {kind}/{name} is {_type_name(value)}; only bool/int/float/str"
                )
            if isinstance(value, str) and not _is_utf8(value):
                raise FederationError(f"{message.type}: scalar {kind}/{name} is not UTF-8 text: {value!r}")
            if isinstance(value, int) and not INT_RANGE[0] <= value <= INT_RANGE[1]:
                raise FederationError(f"{message.type}: scalar {kind}/{name} is beyond 64-bit integers")


def _check_name(message_type: str, kind: str, name: object) -> None:
    """A name is UTF-8 text, as Flower's records carry it (an int name passed in-process, failed there)."""
    if not isinstance(name, str):
        raise FederationError(f"{message_type}: {kind}/{name!r}: a name is {_type_name(name)}, not text")
    if not _is_utf8(name):
        raise FederationError(f"{message_type}: {kind}/{name!r} is not UTF-8 text")


def _is_utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8: not so with lone surrogates (a file name read with surrogate
    escapes), which Flower cannot send and the ledger cannot count."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _type_name(value: object) -> str:
    """A value's type as a refusal names it: `numpy.bool`, not `bool`, for NumPy's own scalars."""
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _check_kind(kind: str, message_type: str) -> None:
    if kind not in CONTENT_KINDS:
        raise FederationError(
            f"{message_type}: unknown content kind {kind!r}; known: {sorted(CONTENT_KINDS)}"
        )


def check_on_receipt(message: Message, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Structure, a size cap and finite values: what a receiver checks before any handler sees it."""
    check_structure(message)
    check_contents(message, max_bytes=max_bytes)


def check_contents(message: Message, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """A size cap and finite values, for a message whose structure `check_structure` has passed."""
    size = message.nbytes
    if size > max_bytes:
        raise FederationError(
            f"{message.type}: payload of {size:,} bytes exceeds the cap of {max_bytes:,} (set max_message_mb)"
        )
    for kind, named in message.arrays.items():
        for name, value in named.items():
            array = decode(value)
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise FederationError(
                    f"{message.type}: {kind}/{name} contains NaN or infinite values{_sent_as(value, array)}"
                )
    for kind, named in message.scalars.items():
        for name, value in named.items():
            if isinstance(value, float) and not np.isfinite(value):
                raise FederationError(f"{message.type}: scalar {kind}/{name} is {value}")


def _sent_as(value: Payload, decoded: np.ndarray) -> str:
    """How a non-finite array crossed, when its wire encoding may have made it so (float16 overflows to
    infinities, never to NaN: a NaN is the sender's own)."""
    encoding = encoding_of(value)
    if encoding == RAW:
        return ""
    if encoding == "float16" and not np.isnan(decoded).any():
        return " (sent as float16, which turns values from 65520 on into infinities: use float16-scaled)"
    return f" (sent as {encoding})"


@dataclass(frozen=True)
class ArraySpec:
    """The dtype and shape a receiver expects; None in the shape accepts any length on that axis."""

    dtype: str
    shape: tuple[int | None, ...]

    @staticmethod
    def of(tensor: torch.Tensor | np.ndarray) -> ArraySpec:
        """The spec a tensor or array itself satisfies: its dtype and exact shape."""
        dtype = str(tensor.dtype).removeprefix("torch.")
        return ArraySpec(dtype, tuple(tensor.shape))

    def matches(self, array: Payload) -> bool:
        """Whether `array` has this dtype and shape (None in the shape matches any length); an encoded
        array matches as the array it decodes to."""
        if array.dtype.name != self.dtype or array.ndim != len(self.shape):
            return False
        return all(e is None or e == s for e, s in zip(self.shape, array.shape, strict=True))


def expect_arrays(message: Message, kind: str, specs: Mapping[str, ArraySpec], *, exact: bool = True) -> None:
    """Check that `message` carries the arrays `specs` declares under `kind` (and, if exact, no others)."""
    got = message.arrays.get(kind, {})
    missing = [name for name in specs if name not in got]
    if missing:
        raise FederationError(f"{message.type}: missing {kind} arrays {missing[:5]}")
    if exact:
        extra = [name for name in got if name not in specs]
        if extra:
            raise FederationError(f"{message.type}: unexpected {kind} arrays {extra[:5]}")
    for name, spec in specs.items():
        array = got[name]
        if not spec.matches(array):
            raise FederationError(
                f"{message.type}: {kind}/{name} is {array.dtype.name}{list(array.shape)}, "
                f"expected {spec.dtype}{list(spec.shape)}"
            )


def state_specs(state: Mapping[str, torch.Tensor]) -> dict[str, ArraySpec]:
    """Array specs for a model's state dict: what a parameters message for that model must look like."""
    return {name: ArraySpec.of(t) for name, t in state.items()}
