"""Differential privacy for what a client releases: gradient sanitisation, per-client accounting, PATE.

The mechanism (`sanitize`, `pate`) and the accountant (`accounting`) are separate pieces, as in
Opacus: an algorithm sanitises what it sends and records the spend on that client's accountant.
`budget` wires them into the algorithms: the ``dp_*`` options, each client's budget, refusals.
"""

from fedistill.privacy.accounting import (
    ACCOUNTANTS,
    ClientAccountant,
    DPConfig,
    PrivacyBudgetExceeded,
    calibrate_noise,
)
from fedistill.privacy.budget import ClientBudget, DPOptions
from fedistill.privacy.pate import (
    DEFAULT_ORDERS,
    confident_gnmax,
    confident_gnmax_rdp,
    gnmax_aggregate,
    gnmax_rdp,
    log_pr_answered,
    log_q_gnmax,
    rdp_data_dependent,
    rdp_gnmax_data_dependent,
    rdp_gnmax_data_independent,
    rdp_threshold_data_dependent,
    rdp_threshold_data_independent,
    rdp_to_epsilon,
)
from fedistill.privacy.sanitize import clip_per_sample, sanitize_per_sample, sanitize_sum

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_ORDERS",
    "ClientAccountant",
    "ClientBudget",
    "DPConfig",
    "DPOptions",
    "PrivacyBudgetExceeded",
    "calibrate_noise",
    "clip_per_sample",
    "confident_gnmax",
    "confident_gnmax_rdp",
    "gnmax_aggregate",
    "gnmax_rdp",
    "log_pr_answered",
    "log_q_gnmax",
    "rdp_data_dependent",
    "rdp_gnmax_data_dependent",
    "rdp_gnmax_data_independent",
    "rdp_threshold_data_dependent",
    "rdp_threshold_data_independent",
    "rdp_to_epsilon",
    "sanitize_per_sample",
    "sanitize_sum",
]
