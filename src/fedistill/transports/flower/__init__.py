"""The Flower transport: the same client and server logic, carried by Flower's Message API.

`codec` maps a fedistill `Message` onto a Flower `RecordDict` and back; `grid_fleet` is the server's
`Fleet` over a Flower `Grid`; `node` builds and keeps one site's client logic on a SuperNode;
`apps` holds the `ServerApp` and `ClientApp` (`flwr run .` finds them through pyproject.toml);
`simulation` runs them on Flower's simulation engine for `fedistill run --transport flower`.
Flower is an optional dependency (`pip install fedistill[flower]`); only these modules import it.
"""

import os

# Before Flower is imported: no telemetry, no dependency installs at run time, quiet Ray and Flower.
for _key, _value in {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
}.items():
    os.environ.setdefault(_key, _value)
