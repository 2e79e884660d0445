"""Where a reproduction reads and writes: the folders of a source checkout.

The paper-scale configs and their expected values (configs/, configs/expected.toml) are not part of the
installed package; they sit next to it in the checkout, as do the benchmark runs and result tables.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The checkout this package is installed from (src/fedistill/reproduce/ lies three levels below it).
CHECKOUT = Path(__file__).resolve().parents[3]
CONFIGS = CHECKOUT / "configs"
EXPECTED = CONFIGS / "expected.toml"
BENCHMARKS = CHECKOUT / "benchmarks"
RESULTS = BENCHMARKS / "results"
RUNS = BENCHMARKS / "runs"
#: Dataset files shared between checkouts, beside the checkout.
DATA = CHECKOUT.parent / "shared" / "data"


def relative_to_checkout(path: str | Path) -> str:
    """``path`` as written from the checkout (``..`` where it lies outside), as result files cite runs."""
    return os.path.relpath(path, CHECKOUT)
