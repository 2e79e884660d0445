"""Which wire encoding each of FedIOD's stage-2 contents travels in (`fediod.wire`).

`float32` sends every array as computed. `compact` sends G's images as 8 bits over each tensor's own
range (a scale and an offset per tensor), two-class label masks as one bit a pixel (exact), and the
logits, discriminator outputs and both gradients as float16 under a per-tensor power-of-two scale
(federation/encodings.py has the error bounds). Why scaled
float16 everywhere: the input-gradients of batch-mean losses sit far below float16's smallest normal
number and a density ratio may exceed its largest, while the scale keeps float16's relative precision
(2^-11, eight times bfloat16's 2^-8) at the same two bytes. `compact8` sends what the sites send most of,
their logits and input-gradients, as 8 bits instead: `int8-symmetric`, one byte a value within half of
1/127 of the tensor's largest magnitude, zero kept exact (an offset grid would add one common error to
every near-zero gradient entry, and those add up in G's update); the rest as `compact`.

Evaluation's two payloads go as float16 under a per-tensor power-of-two scale on every wire but
`float32` (`EVALUATION`): the student the sites score on their validation splits each epoch, and the
teachers' outputs on the test images (the ensemble's reported ceiling). Why: at the dense tables' model
sizes the validation copies were most of what the server sent (Table 9: 120 copies of a 7.76 MB U-Net, 931
of its 1,088 MB), and a validation score read through float16's relative 2^-11 moves by far less than the
epochs it chooses between: Table 9's run selected the same epoch and scored the same to four decimals with
783.8 MB in both directions instead of 1,251.9 (748.8 MB once the label masks went as `bits` too). The
server keeps, selects and hands over its float32 student. Stage 1's statistics go as they are: they are
counts.
"""

from __future__ import annotations

#: `compact`'s encoding per content kind. Label masks of zeros and ones (a two-class segmentation's)
#: travel packed eight to a byte (`bits`, exact); masks with more classes go as they are.
COMPACT = {
    "label-masks": "bits",
    "synthetic-inputs": "uint8-affine",
    "logits": "float16-scaled",
    "discriminator-outputs": "float16-scaled",
    "input-gradients": "float16-scaled",
    "output-gradients": "float16-scaled",
}


#: `compact8`'s: the sites' two largest kinds at one byte a value.
COMPACT8 = {**COMPACT, "logits": "int8-symmetric", "input-gradients": "int8-symmetric"}

#: `compact8-gradients`'s: only the input-gradients at one byte a value.
COMPACT8_GRADIENTS = {**COMPACT, "input-gradients": "int8-symmetric"}

#: `compact8-sqrt`'s: compact8 with the logits on the square-root grid, whose steps are finest near zero,
#: where a two-class segmentation's margins decide a pixel.
COMPACT8_SQRT = {**COMPACT8, "logits": "int8-sqrt"}

BY_WIRE = {"compact": COMPACT, "compact8": COMPACT8, "compact8-gradients": COMPACT8_GRADIENTS,
           "compact8-sqrt": COMPACT8_SQRT}  # fmt: skip
#: every `fediod.wire`: float32 sends each array as it is
WIRES = ("float32", *BY_WIRE)


#: Evaluation's encodings under every wire but float32: the validation copy of the student (`parameters`)
#: and the teachers' outputs on the test images (`logits` of `evaluate.teachers`).
EVALUATION = {"parameters": "float16-scaled", "logits": "float16-scaled"}


def evaluation_encodings(wire: str) -> dict[str, str]:
    """The encodings per content kind of evaluation's messages under `fediod.wire = wire`."""
    return {} if wire == "float32" else dict(EVALUATION)


def wire_encodings(wire: str) -> dict[str, str]:
    """The encodings per content kind that `fediod.wire = wire` sends stage 2's messages in."""
    return dict(BY_WIRE.get(wire, {}))
