"""FedGen (Zhu et al. 2021, "Data-Free Knowledge Distillation for Heterogeneous Federated Learning").

The server learns a conditional *feature* generator G(y, ε) from what the clients upload: their
heads (``classifier.*``) and their label counts. G must produce, for a label y, latent features that
the clients' heads classify as y, each head trusted on a class in proportion to its share of that
class's samples (w_{k,c} = n_{k,c} / Σ_j n_{j,c}); a diversity term keeps G from collapsing to one
point per class. G then travels to the clients, where it regularises local training through the head:

    L_k = CE(f_k(x), y) + (B_g/B)·α_t·CE(head_k(G(ŷ)), ŷ) + β_t·KL(softmax(head_k(G(y))) ‖ f_k(x)),

with ŷ drawn from the global label distribution, α_t = max(1e-4, α₀·0.98^t), β_t likewise, from the
second round on (there is no trained G in the first). The server also averages what it received
(weighted by sample counts) and sends it back with G.

What leaves a client each round: the parameters it shares (``share``) and its class counts
(ledger kind ``label-statistics``). FedGen's code averages whole models (``share = "model"``, the
default, giving a global model and a ``test_accuracy``); the FedMD-CG paper compares against FedGen
"sharing the clients' classifiers" (``share = "classifier"``): the extractors stay private, as in
LG-FedAvg, and only the personal models' metrics exist.

Defaults are FedGen's MNIST configuration: G = one hidden layer of 256 (Linear, BatchNorm, ReLU),
noise ε ~ U[0, 1)^32, one-hot labels; 50 Adam steps per round on batches of 32 labels (lr 3e-4,
weight decay 1e-2, learning rate ×0.98 per round); teacher weight 1, diversity weight 1 with FedGen's
distances (squared L2 on ε, L1 on G's outputs), no adversarial student term; α₀ = β₀ = 10 on the clients.

Where the paper and the released code differ, the paper is the default and the code an option:
``label_sampling = "counts"`` draws labels ∝ the global label counts (the paper's p̂(y)); the code
draws them uniformly (the server over labels some client holds more than one sample of, the clients
over all labels), ``label_sampling = "uniform"``. Label counts are those of the client's training
data; the code counts the labels of the batches seen in the round, plus one. One more difference of the
code is not an option: it multiplies each client's (B,) cross-entropies by (B, 1) weights, which
broadcasts to B×B, so its teacher term is mean_b CE × mean_b w_{k,y_b} (the weights no longer pick the
samples of the classes a client holds); here each sample's CE is weighted by its own w_{k,y_b}.

G's output is the model's split point: the extractor's features, read by the whole head
(``classifier.*``, fc1 → fc2 for ``lenet-fedmdcg``). FedGen's code generates the input of the last
layer only (``latent_layer_idx = -1``, 32 values for its MNIST CNN), so its "head" is that one layer.

Metrics as in fedper.py (algorithms/fedmdcg/personalized.py): ``local_accuracy`` is each client's model just
after local training on its own IID test shard (sample-weighted), ``personal_test_accuracy`` the mean
of those models on the test set.
The in-process runner adds the FedMD-CG paper's global accuracy, ``global_accuracy_oracle``: the
average of the full local models, an evaluation-only oracle outside the protocol (shared/oracle.py).

Files: the options and the generator's construction in fedgen_options.py, the client in
fedgen_client.py, the server in fedgen_server.py; here the registration.
"""

from __future__ import annotations

from fedistill.algorithms.base import Algorithm, register
from fedistill.algorithms.fedmdcg.fedgen_client import FedGenClient
from fedistill.algorithms.fedmdcg.fedgen_options import FedGenOptions
from fedistill.algorithms.fedmdcg.fedgen_server import FedGenServer
from fedistill.algorithms.shared.oracle import average_local_models

register(
    Algorithm(
        "fedgen",
        "FedGen: a server-trained feature generator regularises local training; models averaged",
        FedGenClient,
        FedGenServer,
        FedGenOptions,
        oracle=average_local_models,
    )
)
