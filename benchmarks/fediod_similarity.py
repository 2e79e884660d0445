"""How close FedIOD's synthetic images come to each client's private images (the FedIOD paper's Figure 4),
against what a FedAvg server recovers from one client update by gradient inversion (DLG).

FedIOD's server never sees a parameter or a parameter-gradient; what it ends up holding is its generator
and the synthetic transfer data drawn from it. The paper argues those data are no copy of private data by
the FID between the synthetic images and each client's private images (larger = more private). For a
finished FedIOD run this script measures, per client, with `fedistill.analysis.similarity` (the study is
`fedistill.reproduce.fediod_similarity`):

* **Synthetic set**: ``--synthetic`` samples of the run's saved generator (``models/generator.safetensors``)
  drawn as its server draws transfer data: BatchNorm in train mode (batch statistics) over batches of
  the run's ``fediod.synthetic_batch_size``, the latents of the server's own per-G-step streams
  (run seed, "latent", step), normalised model inputs mapped back to [0, 1] with the dataset's mean/std.
  ``--generator-bn running`` draws in eval mode instead (running statistics, as `GeneratorSource` does).
* **Private set of client k**: every training image it holds (its train shard and the validation shard
  it keeps locally), rebuilt from the run's config with `prepare_data` and checked against the saved
  partition's hash.
* **Feature network and reference**: LeNet-5 trained on the first half of the test split
  (`held_out_halves`); the held-out real reference is a seeded subset of the second half, as large as the
  synthetic set (FID depends on set size). Metrics: FID on its 84-d features, nearest-neighbour distances
  in pixel and feature space, and the memorisation share (closer than the reference's 5th percentile).
  Two baselines for reading the FIDs: the synthetic set's FID to the held-out set itself (how far G's
  samples are from real data that no client holds), and each client's label skew (total-variation
  distance of its class distribution from the held-out set's; a non-IID shard is far from any balanced
  reference, which moves the held-out FID from client to client).
* **The contrast, DLG**: ``--dlg-images`` of client k's private images, each held by a FedAvg client (with
  one other image of client k) that takes one SGD step of batch 1 in round 1 on ``lenet-fedmdcg-dlg``
  (Sigmoid, no max-pool, no normalisation: the variant where DLG succeeds), exactly the ``fedavg-1step``
  threat model of ``fedistill.analysis.threat_models``, whose code runs it; the server inverts each update with DLG
  (``--dlg-iterations`` L-BFGS steps). The reconstructions get the same metrics against client k's
  private set, plus the PSNR against their true images (reference: the training split's mean image).
  A FID of so few points is degenerate: it is reported and flagged, next to held-out real images at the
  same count, and the row is read on NN distances, memorisation share and PSNR.

    python benchmarks/fediod_similarity.py [--run benchmarks/runs/fediod-fashion-mnist-alpha1-seed0/fediod] \
        [--synthetic 2000] [--clients all] [--dlg-images 8] [--dlg-iterations 100] [--feature-epochs 3] \
        [--seed 0] [--threads 1]

Writes benchmarks/results/fediod_similarity_<dataset>.{md,json,png}; several runs of one dataset share the
files (one section and one row of plots per run).
"""

from __future__ import annotations

import os

from fedistill.reproduce.fediod_similarity import main

if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    raise SystemExit(main())
