"""Flower's apps around the run loop: the ServerApp runs the suite over a Flower Grid; the ClientApp
(and a node's long-lived worker) builds one site's client logic and answers its messages.
The generic transport (codec, GridFleet, simulation engine) is `fedistill.transports.flower`."""

import fedistill.transports.flower  # noqa: F401  (Flower's environment, set before Flower is imported)
