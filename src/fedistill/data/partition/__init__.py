"""Seeded splits of a labelled training set into federated clients.

The three seed papers each ship their own Dirichlet partitioner and they do not produce the same skew for
the same alpha, so each one is reproduced here under its own name (the FedGen variant is not included):

* ``iid`` -- every class dealt evenly over the clients (FedMD-CG's ``iid`` mode, without its float
  rounding, so client sizes differ by at most one sample per class).
* ``dirichlet`` -- FedIOD's ``dirichlet_datasplit``: one Dir(alpha) row per class, consecutive chunks.
* ``dirichlet-balanced`` -- FedDF's ``build_non_iid_by_dirichlet``: groups of clients, "balance" trick,
  retry until the smallest client is at least half the average.
* ``dirichlet-equal`` -- FedMD-CG's ``non_iid_dirichlet_balanced`` (its default): every client draws a
  class prior and exactly floor(N/K) samples.
* ``dirichlet-unbalanced`` -- FedMD-CG's ``non_iid_dirichlet_unbalanced``: per-class Dir(alpha) with the
  same "balance" trick as FedDF, retried until every client has ``min_size`` samples.
* ``dirichlet-flwr`` -- flwr-datasets' ``DirichletPartitioner`` run on an index table (optional extra).

Every function draws from its own ``numpy.random.default_rng(seed)``, never from global RNG state, so the
same inputs and seed give the same split on every machine. The original codes used global or
``RandomState`` streams, so a split here matches theirs in distribution, not sample for sample.
"""

from fedistill.data.partition.holdout import class_counts, holdout, iid_shards
from fedistill.data.partition.partitioners import (
    dirichlet,
    dirichlet_balanced,
    dirichlet_equal,
    dirichlet_flwr,
    dirichlet_unbalanced,
    iid,
    natural,
)
from fedistill.data.partition.registry import DIRICHLET, PARTITIONERS, Partitioner, get_partitioner, partition
from fedistill.data.partition.split import FederatedSplit, load_split, make_split, save_split

__all__ = [
    "DIRICHLET",
    "PARTITIONERS",
    "FederatedSplit",
    "Partitioner",
    "class_counts",
    "dirichlet",
    "dirichlet_balanced",
    "dirichlet_equal",
    "dirichlet_flwr",
    "dirichlet_unbalanced",
    "get_partitioner",
    "holdout",
    "iid",
    "iid_shards",
    "load_split",
    "make_split",
    "natural",
    "partition",
    "save_split",
]
