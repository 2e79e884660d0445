"""FedCG (Wu et al. 2022, "FedCG: Leverage Conditional GAN for Protecting Privacy and Maintaining
Competitive Performance in Federated Learning"), as the FedMD-CG paper re-implements it for its comparison.

Each client has a private feature extractor F_k, a shared classifier C and a conditional feature
generator G_k(y, ε) with a private feature discriminator D_k. A round on client k:

1. put the received global classifier under F_k and reset G_k to the received global generator Ĝ;
2. train F_k and C on private data with CE + γ(t)·MSE(F_k(x), Ĝ(y, ε)) (Ĝ frozen): the extractor is
   pulled towards the features the federation's generator draws for the same labels;
3. train G_k against D_k on this round's batches (one D step and one G step per batch): D_k tells the
   trained extractor's features F_k(x) from G_k(y, ε) (the standard GAN losses), so G_k learns to
   draw F_k's features for a label;
4. upload C and G_k. The extractor never leaves the client; the discriminator neither.

The server averages the classifiers and the generators (by sample count). With ``aggregation =
"distill"`` it then distils the averaged pair (G, C) for ``distill_steps`` Adam steps towards the
sample-weighted ensemble softmax(Σ_k π_k·C_k(G_k(y))/T), y drawn ∝ the clients' label counts (the
FedMD-CG repo's ``fedcg`` server mode, and the original's KD); only then do clients send label counts.

Defaults are the FedMD-CG repo's (its FedCG baseline): γ(t) = γ₀·(t/(R−1))³ with γ₀ = 1; G =
FedMD-CG's generator (two Linear-BatchNorm-ReLU blocks, sizes by dataset, ε ~ U[0, 1), one-hot
labels, no output activation); D = the classifier's shape with one output, Linear(h, w) → Linear(w, 1)
(no activation in between, as the code's "classifier with output dimension 1") and a sigmoid, w =
FedMD-CG's fc1 width for the dataset; Adam lr 3e-4, betas (0.9, 0.999), weight decay 1e-4 for G and D,
optimiser states and D kept across rounds; plain averaging on the server. The FedMD-CG paper's own
FedCG row distilled instead: its Table 1 FedCG cells are its Table 3 row "FedCG, KD_agg" (``aggregation
= "distill"`` here), while the averaging kept here is that table's "FedCG, AVE_agg⋆" row.

The original FedCG differs; its cheap differences are options: ``gamma_schedule = "sigmoid"``
(γ = γ₀·(2/(1+e^{−10p}) − 1), p = min(t/50, 1)), ``noise = "normal"``, ``label_input = "embedding"``,
``output_activation = "sigmoid"``, ``conditional_discriminator`` (D also sees the label; only
useful with ``discriminator_activation = "leaky-relu"``, since a linear D turns the label into a
bias), ``gan_beta1 = 0.5``, ``gan_passes = 20`` (epochs of GAN training), ``aggregation = "distill"``. Not
reproduced: its LeNet-5 feature maps and convolutional generator/discriminator, and its KD's shared ε
between student and teachers (here every generator call draws its own ε, as in the FedMD-CG repo).
Nor the repo's de-duplication of cached batches by label sum (a bug that drops some batches from the
GAN stage): every batch of the round is used.

Metrics as in fedper.py (algorithms/fedmdcg/personalized.py): ``local_accuracy`` (each client's full model
after local training, on its own IID test shard, sample-weighted) and ``personal_test_accuracy``;
there is no global model. The in-process runner adds the FedMD-CG paper's global accuracy,
``global_accuracy_oracle``: the average of the full local models, an evaluation-only oracle outside
the protocol (algorithms/shared/oracle.py).

Files: the options in fedcg_options.py, the discriminator and the GAN stage in fedcg_gan.py, the
client in fedcg_client.py, the server in fedcg_server.py; here the registration.
"""

from __future__ import annotations

from fedistill.algorithms.base import Algorithm, register
from fedistill.algorithms.fedmdcg.fedcg_client import FedCGClient
from fedistill.algorithms.fedmdcg.fedcg_options import FedCGOptions
from fedistill.algorithms.fedmdcg.fedcg_server import FedCGServer
from fedistill.algorithms.shared.oracle import average_local_models

register(
    Algorithm(
        "fedcg",
        "FedCG: private extractors; shared classifiers and conditional feature generators (cGAN) averaged",
        FedCGClient,
        FedCGServer,
        FedCGOptions,
        oracle=average_local_models,
    )
)
