"""Wire encodings: how an array may cross the boundary in fewer bytes, and how it is read back.

A sender names an encoding per content kind (`Message.build(..., encodings={"logits": "float16-scaled"})`);
each array of that kind that the encoding takes (float32; `bits`: a uint8 mask of zeros and ones) then
travels as an `Encoded` value: the wire array (uint8, float16 or uint16 bit patterns) and a few per-tensor
numbers (a scale, an offset; `bits`: the shape). Receivers never see the wire form: `Message.array` and
`Message.tensor` decode it (to float32; `bits` to uint8). Every encoding is plain NumPy arithmetic on the
CPU, so the same wire bytes decode to the same values on any machine and transport.

The encodings and their round-trip error (x the sent value, x' the decoded one, m = max |x|):

- `raw`: the array as it is; exact.
- `float16`: IEEE half precision; |x - x'| <= 2^-11 |x| for 2^-14 <= |x| < 65520, 2^-25 below; values
  from 65520 on (half a step past its largest, 65504) become infinite (and the receiver rejects the
  message). For values of known small range.
- `float16-scaled`: half precision after dividing by a power of two that puts m just under 2^15: the
  relative error of `float16` over any range, |x - x'| <= max(2^-11 |x|, 2^-39 m), never overflowing.
- `bfloat16`: float32's upper 16 bits, rounded to nearest even: |x - x'| <= 2^-8 |x| over float32's range
  but its top half step: values past 3.3961e38 round to infinity (and the receiver rejects the message);
  below float32's smallest normal number, 2^-126 (1.2e-38), where bfloat16 keeps fewer digits, 2^-134.
- `uint8-affine`, `uint16-affine`: x' = offset + q * scale with q on 255 (65535) levels between the
  tensor's minimum and maximum: |x - x'| <= scale / 2 + 2^-22 max(|min|, |max|); a constant tensor is exact.
  Zero need not be on the grid: for images, not for values whose many near-zero entries add up. The
  decoder computes in float32, so a tensor whose range (maximum - minimum) exceeds float32's largest
  value, 3.4e38, decodes to infinities at its top (and the receiver rejects the message).
- `int8-symmetric`: x' = q * scale with q in -127..127 and scale = m / 127: |x - x'| <= scale / 2 (plus
  float32 rounding, 2^-23 m); zero and sign are kept, so near-zero values (most of a gradient) decode to
  at most scale / 2 from their value, never to a common offset.
- `int8-sqrt`: the same byte on a square-root grid, x' = sign(q) q^2 scale with q in -127..127 and
  scale = m / 127^2: |x - x'| <= sqrt(|x| m) / 127 + m / 64516 (plus 2^-23 m). Finer steps near zero
  (the smallest is m / 16129 instead of m / 127), coarser near m: for values whose range a few large
  ones set, as a segmentation's per-pixel margins, where the confident background is far from zero and the
  boundary pixels near it.
- `bits`: a uint8 array of zeros and ones (a two-class label mask) packed eight values to a byte; exact.
  Its per-tensor numbers are the array's shape, which packing flattens. An array with another value, or
  of another dtype, travels as it is.

The grids' bounds hold while their scale is a normal float32 (at least 2^-126): for a tensor whose range
(the int8 grids: m) is below about 1e-33, the scale is rounded to a multiple of float32's finest step,
2^-149, and the error may grow by up to L 2^-150, L the grid's top level (255, 65535, 127; `int8-sqrt`:
127^2); a tensor whose scale rounds to 0 decodes to zeros.

A non-finite value stays non-finite through every encoding (the affine ones then decode to NaN
everywhere), so the receiver's check still refuses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fedistill.errors import FederationError

#: What a plain array is recorded as; no conversion.
RAW = "raw"
#: The bytes each per-tensor number (scale, offset) counts for, as a scalar does in the ledger.
PARAM_BYTES = 8

Params = tuple[float, ...]


@dataclass(frozen=True)
class WireFormat:
    """One encoding: the dtype its wire array has, how many per-tensor numbers travel with it (None: as
    many as the decoded array has axes, which they give), its two halves, and the dtype it decodes to."""

    wire_dtype: str
    params: int | None
    encode: Callable[[np.ndarray], tuple[np.ndarray, Params]]
    decode: Callable[[np.ndarray, Params], np.ndarray]
    decoded_dtype: str = "float32"
    accepts: Callable[[np.ndarray], bool] | None = None

    def takes(self, array: np.ndarray) -> bool:
        """Whether `array` may travel in this encoding; a sender sends any other as it is."""
        if array.dtype != np.dtype(self.decoded_dtype):
            return False
        return self.accepts is None or bool(self.accepts(array))


@dataclass(frozen=True, eq=False)
class Encoded:
    """An array in its wire form. It answers `dtype`, `shape` and `ndim` as the decoded array does (what
    array specs check) and `nbytes` as what crosses the wire (what the ledger counts).

    It is not an array: NumPy cannot read it implicitly, so every read goes through `decoded` (via
    `Message.array`), which decodes once and keeps the result."""

    encoding: str
    data: np.ndarray
    params: Params = ()

    @property
    def _format(self) -> WireFormat | None:
        return ENCODINGS.get(self.encoding)

    @property
    def dtype(self) -> np.dtype:
        wire = self._format
        return np.dtype(wire.decoded_dtype if wire is not None else np.float32)

    @property
    def shape(self) -> tuple[int, ...]:
        wire = self._format
        if wire is not None and wire.params is None:  # the numbers are the shape
            return tuple(int(p) for p in self.params)
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes) + PARAM_BYTES * len(self.params)

    def __len__(self) -> int:
        return self.shape[0]

    @cached_property
    def decoded(self) -> np.ndarray:
        """The array the receiver reads (decoded once, read-only)."""
        array = np.asarray(wire_format(self.encoding).decode(self.data, self.params))  # 0-d: not a scalar
        array.flags.writeable = False
        return array

    def check(self) -> str | None:
        """What is wrong with this value's wire form, or None."""
        if self.encoding == RAW:  # a plain array travels as itself, never as an encoded value
            return f"{RAW!r} is no wire encoding; known: {', '.join(encoding_names()[1:])}"
        if self.encoding not in ENCODINGS:
            return f"unknown encoding {self.encoding!r}; known: {', '.join(encoding_names()[1:])}"
        wire = ENCODINGS[self.encoding]
        if not isinstance(self.data, np.ndarray) or self.data.dtype.name != wire.wire_dtype:
            got = getattr(getattr(self.data, "dtype", None), "name", type(self.data).__name__)
            return f"{self.encoding} travels as {wire.wire_dtype}, got {got}"
        if not all(isinstance(p, float) for p in self.params):
            return f"{self.encoding} carries float parameters, got {self.params!r}"
        if wire.params is None:
            if not all(p >= 0 and p.is_integer() for p in self.params) or not _makeable(self.shape):
                return f"{self.encoding} carries its array's shape, got {self.params!r}"
            if self.data.ndim != 1 or self.data.size != -(-math.prod(self.shape) // 8):
                return f"{self.encoding}: {self.data.size} bytes do not hold shape {list(self.shape)}"
        elif len(self.params) != wire.params:
            return f"{self.encoding} carries {wire.params} float parameters, got {self.params!r}"
        return None


def _makeable(shape: tuple[int, ...]) -> bool:
    """Whether NumPy can make an array of `shape` (not too many axes, none too long), allocating nothing."""
    try:
        np.broadcast_to(np.zeros((), np.uint8), shape)
    except (ValueError, OverflowError):
        return False
    return True


def encode(encoding: str, array: np.ndarray) -> Encoded | np.ndarray:
    """`array` in the wire form of `encoding` (float32 arrays; `bits`: uint8 zeros and ones); `raw`
    returns the array itself."""
    if encoding == RAW:
        return array
    wire = wire_format(encoding)
    if not wire.takes(array):
        raise FederationError(
            f"encoding {encoding!r} applies to {wire.decoded_dtype} arrays"
            f"{' of zeros and ones' if wire.accepts is not None else ''}, not this {array.dtype} one"
        )
    return _encoded(encoding, wire, array)


def encode_or_keep(encoding: str, array: np.ndarray) -> Encoded | np.ndarray:
    """`array` in the wire form of `encoding` if the encoding takes it, else the array as it is (what a
    sender does with each array of a kind it names an encoding for)."""
    if encoding == RAW:
        return array
    wire = wire_format(encoding)
    return _encoded(encoding, wire, array) if wire.takes(array) else array


def _encoded(encoding: str, wire: WireFormat, array: np.ndarray) -> Encoded:
    # not np.ascontiguousarray: it turns a 0-d array (a scalar parameter) into shape (1,)
    data, params = wire.encode(np.asarray(array, order="C"))
    data = np.asarray(data)  # NumPy's arithmetic gives a scalar, not an array, for a 0-d input
    data.flags.writeable = False
    return Encoded(encoding, data, params)


def decode(value: Encoded | np.ndarray) -> np.ndarray:
    """What the receiver reads: a plain array as it is, an encoded one decoded (float32; `bits`: uint8)."""
    return value.decoded if isinstance(value, Encoded) else value


def encoding_of(value: Encoded | np.ndarray) -> str:
    """The encoding a payload value travels in (`raw` for a plain array)."""
    return value.encoding if isinstance(value, Encoded) else RAW


def wire_format(encoding: str) -> WireFormat:
    """The encoding called `encoding`; FederationError naming the known ones otherwise."""
    try:
        return ENCODINGS[encoding]
    except KeyError:
        raise FederationError(
            f"unknown encoding {encoding!r}; known: {', '.join(encoding_names())}"
        ) from None


def encoding_names() -> list[str]:
    """Every encoding's name, `raw` first."""
    return [RAW, *sorted(name for name in ENCODINGS if name != RAW)]


# --- the encodings --------------------------------------------------------------------------------
def _float16_encode(x: np.ndarray) -> tuple[np.ndarray, Params]:
    with np.errstate(over="ignore"):  # from 65520 on: infinite, as documented; the receiver refuses it
        return x.astype(np.float16), ()


def _float16_decode(data: np.ndarray, params: Params) -> np.ndarray:
    return data.astype(np.float32)


#: float16's exponent for the largest value after scaling: m / scale lies in [2^14, 2^15).
_FLOAT16_TOP = 15
#: The smallest scale, a normal float32, so the decoder's product stays exact.
_MIN_SCALE_EXPONENT = -126


def _float16_scaled_encode(x: np.ndarray) -> tuple[np.ndarray, Params]:
    finite = np.abs(x[np.isfinite(x)])
    top = float(finite.max()) if finite.size else 0.0
    exponent = np.frexp(top)[1] - _FLOAT16_TOP if top > 0 else 0  # top = f 2^e, f in [0.5, 1)
    scale = np.float32(np.ldexp(1.0, max(int(exponent), _MIN_SCALE_EXPONENT)))
    return (x / scale).astype(np.float16), (float(scale),)  # division by a power of two: exact


def _float16_scaled_decode(data: np.ndarray, params: Params) -> np.ndarray:
    return data.astype(np.float32) * np.float32(params[0])


def _bfloat16_encode(x: np.ndarray) -> tuple[np.ndarray, Params]:
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest, ties to even
    rounded = np.where(np.isnan(x), 0x7FC0, rounded)  # a NaN stays a NaN
    return rounded.astype(np.uint16), ()


def _bfloat16_decode(data: np.ndarray, params: Params) -> np.ndarray:
    return (data.astype(np.uint32) << 16).view(np.float32)


def _affine(bits: int) -> WireFormat:
    levels = (1 << bits) - 1
    wire = np.uint8 if bits == 8 else np.uint16

    def encode_affine(x: np.ndarray) -> tuple[np.ndarray, Params]:
        if x.size == 0:
            return np.zeros(x.shape, wire), (0.0, 0.0)
        if not np.isfinite(x).all():  # decodes to NaN everywhere: the receiver refuses it
            return np.zeros(x.shape, wire), (float("nan"), float("nan"))
        low, high = float(x.min()), float(x.max())
        offset, scale = np.float32(low), np.float32((high - low) / levels)
        if scale == 0:
            return np.zeros(x.shape, wire), (0.0, float(offset))
        # the nearest level of the decoder's grid (offset + q scale), in float64
        q = np.rint((x.astype(np.float64) - float(offset)) / float(scale))
        return np.clip(q, 0, levels).astype(wire), (float(scale), float(offset))

    def decode_affine(data: np.ndarray, params: Params) -> np.ndarray:
        scale, offset = np.float32(params[0]), np.float32(params[1])
        return data.astype(np.float32) * scale + offset

    return WireFormat(np.dtype(wire).name, 2, encode_affine, decode_affine)


_INT8_TOP = 127


def _int8_grid(power: int) -> WireFormat:
    """One signed byte on the grid x' = sign(q) |q|^power scale, q in -127..127, scale = m / 127^power:
    power 1 is the linear grid (`int8-symmetric`), power 2 the square-root one (`int8-sqrt`)."""

    def encode_grid(x: np.ndarray) -> tuple[np.ndarray, Params]:
        if not np.isfinite(x).all():  # decodes to NaN everywhere: the receiver refuses it
            return np.zeros(x.shape, np.int8), (float("nan"),)
        top = float(np.abs(x).max()) if x.size else 0.0
        if top == 0:
            return np.zeros(x.shape, np.int8), (0.0,)
        scale = np.float32(top / _INT8_TOP**power)
        if scale == 0:  # below float32's subnormals (max |x| < ~2e-41): nothing a byte can tell from 0
            return np.zeros(x.shape, np.int8), (0.0,)
        # power 1: the nearest level of the decoder's grid; power 2: the nearest in the square-root domain,
        # which for a few values near a midpoint is the neighbour of the nearest level (well within the
        # stated bound). In float64: sqrt is correctly rounded on any machine.
        level = np.abs(x.astype(np.float64)) / float(scale)
        q = np.rint(level if power == 1 else np.sqrt(level))
        return (np.clip(q, 0, _INT8_TOP) * np.sign(x)).astype(np.int8), (float(scale),)

    def decode_grid(data: np.ndarray, params: Params) -> np.ndarray:
        q = data.astype(np.float32)
        magnitude = q if power == 1 else q * np.abs(q)  # exact in float32: the product rounds once
        return magnitude * np.float32(params[0])

    return WireFormat("int8", 1, encode_grid, decode_grid)


def _identity(x: np.ndarray) -> tuple[np.ndarray, Params]:
    return x, ()


def _bits_encode(x: np.ndarray) -> tuple[np.ndarray, Params]:
    return np.packbits(x.reshape(-1)), tuple(float(n) for n in x.shape)


def _bits_decode(data: np.ndarray, params: Params) -> np.ndarray:
    shape = tuple(int(p) for p in params)
    return np.unpackbits(data, count=math.prod(shape)).reshape(shape)


def _zeros_and_ones(x: np.ndarray) -> bool:
    return x.size == 0 or int(x.max()) <= 1


ENCODINGS: dict[str, WireFormat] = {
    RAW: WireFormat("float32", 0, _identity, lambda data, params: data),
    "float16": WireFormat("float16", 0, _float16_encode, _float16_decode),
    "float16-scaled": WireFormat("float16", 1, _float16_scaled_encode, _float16_scaled_decode),
    "bfloat16": WireFormat("uint16", 0, _bfloat16_encode, _bfloat16_decode),
    "uint8-affine": _affine(8),
    "uint16-affine": _affine(16),
    "int8-symmetric": _int8_grid(1),
    "int8-sqrt": _int8_grid(2),
    "bits": WireFormat("uint8", None, _bits_encode, _bits_decode, "uint8", _zeros_and_ones),
}
