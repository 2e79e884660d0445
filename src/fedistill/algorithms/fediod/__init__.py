"""FedIOD: one-shot, data-free federated learning by input and output collaborative distillation.

Stage 1 (nothing is sent): every client trains its own model T_k once, with any architecture.
Stage 2: the server holds a generator G and the central student S; every client holds its frozen
T_k and a patch discriminator D_k that it trains on its own data. One distillation step:

1. server -> clients  `query.generate`: synthetic inputs x = G(w), and per-client loss weights.
   Each client updates D_k on (x, a batch of its own data), then returns its logits T_k(x) and, under
   Eq. 8's weighting, its density ratio D_k(x) / E[D_k(x')], keeping the graph of the terms it computes alone:
   pi_k * L_gan^k (Eq. 2) and pi_k * H(T_k(x)) (Eq. 3).
2. The server computes the terms that need every client at once, L_unique = -JSD (Eq. 4-5) and
   -L_mimic (Eq. 9-10, S against the importance-weighted ensemble), and sends each client
   `query.backprop`: the gradient with respect to its logits. Each client returns the input-gradient
   of its local terms plus the server's terms pulled through T_k, in one backward pass. The server
   adds the gradient through S and updates G with the sum dL/dx.
3. server -> clients `query.student`: the inputs of all S-steps of this iteration in one message;
   clients return logits (and, under Eq. 8, density ratios); the server takes the S-steps on L_mimic.

No client ever sends parameters. Clients send label statistics only when the ensemble weighting
needs them (Eq. 8 or the released code's class shares), and model selection uses the clients'
validation splits (`evaluate.student`: S's parameters down, metrics up).

The package: `options.py` (defaults and presets), `client.py` (the site, and what differential
privacy sanitises), `server.py` (stage 1, epochs, selection state and checkpoints),
`generator_step.py` (one G-step: steps 1-2 above), `student.py` (the S-steps, the replay pool and
model selection), `losses.py` (every term of Eq. 2-11), `draws.py` (what G draws from),
`task_view.py` (per-pixel outputs for per-pixel tasks), `reference.py` (the ensemble's ceiling, mask uploads),
`step_sites.py` (which sites a G-step asks: `sites_per_step`), `site_discriminator.py` (D_k, built when first
asked).
"""

from fedistill.algorithms.base import ALL_TASKS, Algorithm, register
from fedistill.algorithms.fediod import losses
from fedistill.algorithms.fediod.client import FedIODClient
from fedistill.algorithms.fediod.options import (
    FedIODOptions,
    cosine_lr,
    network_widths,
    resolve_for_task,
    resolve_options,
    teacher_name,
)
from fedistill.algorithms.fediod.presets import LEAN_SMALL_MASKS, OFFICIAL_CODE
from fedistill.algorithms.fediod.server import Federation, FedIODServer
from fedistill.algorithms.fediod.task_view import TaskView
from fedistill.algorithms.shared.stage1 import STAGE1_UNUSED_KEYS
from fedistill.algorithms.shared.training import task_of
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo

__all__ = [
    "LEAN_SMALL_MASKS",
    "OFFICIAL_CODE",
    "FedIODClient",
    "FedIODOptions",
    "FedIODServer",
    "Federation",
    "TaskView",
    "cosine_lr",
    "losses",
    "network_widths",
    "resolve_for_task",
    "resolve_options",
    "teacher_name",
]


def resolve_for_run(config: RunConfig, options: FedIODOptions, info: DatasetInfo) -> FedIODOptions:
    """The options a run applies on the dataset's task (`resolve_for_task`): `Algorithm.resolve_options`."""
    return resolve_for_task(config, options, TaskView(task_of(config, info), info, config.seed))[0]


register(
    Algorithm(
        "fediod",
        "FedIOD: one-shot data-free input+output distillation (no client sends parameters)",
        FedIODClient,
        FedIODServer,
        FedIODOptions,
        tasks=ALL_TASKS,
        unused_keys=STAGE1_UNUSED_KEYS,
        resolve_options=resolve_for_run,
    )
)
