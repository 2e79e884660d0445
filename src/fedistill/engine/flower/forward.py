"""The package's ClientApp (pyproject.toml's `clientapp`). It imports Flower and the standard
library only: a deployed SuperNode starts a fresh process per message, and with `worker=true` in the
node config that process just hands the message to the node's long-lived worker (`worker.py`)."""

from fedistill.transports.flower.forward import NodeClientApp

client_app = NodeClientApp(
    ephemeral="fedistill.engine.flower.apps:client_app", worker_module="fedistill.engine.flower.worker"
)
