"""Gradient inversion (DLG, iDLG, multi-step updates) and the image metrics that score it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedistill.metrics.image_quality import best_match_psnr, psnr, save_image_grid, ssim
from fedistill.privacy.attacks import (
    NoLastLayerError,
    dlg_attack,
    idlg_attack,
    infer_labels,
    match_distance,
    update_to_gradient,
)

NUM_CLASSES = 10


def sigmoid_lenet(seed: int = 0) -> nn.Module:
    """The DLG paper's LeNet (Sigmoid, strided 5x5 convs, weights uniform in [-0.5, 0.5]) sized for 8x8."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 12, 5, padding=2, stride=2),
        nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, padding=2, stride=2),
        nn.Sigmoid(),
        nn.Conv2d(12, 12, 5, padding=2, stride=1),
        nn.Sigmoid(),
        nn.Flatten(),
        nn.Linear(12 * 2 * 2, NUM_CLASSES),
    )
    for p in model.parameters():
        nn.init.uniform_(p, -0.5, 0.5)
    return model


def structured_image(seed: int) -> torch.Tensor:
    """A smooth random 1x8x8 image in [0, 1]: three random plane waves, rescaled."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 8), torch.linspace(0, 1, 8), indexing="ij")
    image = torch.zeros(8, 8)
    for _ in range(3):
        fx, fy, phase = (torch.rand(3, generator=g) * torch.tensor([3.0, 3.0, 2 * math.pi])).tolist()
        image += torch.cos(2 * math.pi * (fx * xx + fy * yy) + phase)
    image = (image - image.min()) / (image.max() - image.min())
    return image.reshape(1, 1, 8, 8)


def client_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """What the client sends: the gradient of its mean cross-entropy, in parameter order."""
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    return [g.detach() for g in grads]


# --- attacks ---------------------------------------------------------------------------------------


def test_dlg_reconstructs_a_single_image_and_its_label() -> None:
    model, x, y = sigmoid_lenet(), structured_image(1), torch.tensor([3])
    grads = client_gradient(model, x, y)
    start = time.process_time()
    result = dlg_attack(
        model,
        grads,
        x.shape,
        NUM_CLASSES,
        iterations=30,
        max_iter_per_step=10,
        generator=torch.Generator().manual_seed(0),
    )
    elapsed = time.process_time() - start
    assert result.reconstruction.shape == x.shape
    assert psnr(x, result.reconstruction).item() > 30.0
    assert result.labels.tolist() == [3]
    assert result.soft_labels is not None and result.soft_labels.shape == (1, NUM_CLASSES)
    assert result.loss_history[-1] < 1e-6 < result.loss_history[0]
    assert not result.diverged
    assert elapsed < 5.0
    assert all(p.grad is None for p in model.parameters())  # the attack leaves the model's .grad alone


def test_dlg_dict_gradients_match_list_gradients() -> None:
    model, x, y = sigmoid_lenet(), structured_image(2), torch.tensor([5])
    grads = client_gradient(model, x, y)
    named = {name: g for (name, _), g in zip(model.named_parameters(), grads, strict=True)}
    kwargs = {"iterations": 2, "max_iter_per_step": 3}
    a = dlg_attack(model, grads, x.shape, NUM_CLASSES, generator=torch.Generator().manual_seed(1), **kwargs)
    b = dlg_attack(model, named, x.shape, NUM_CLASSES, generator=torch.Generator().manual_seed(1), **kwargs)
    assert torch.equal(a.reconstruction, b.reconstruction)
    assert a.loss_history == b.loss_history


@pytest.mark.parametrize("label", [0, 4, 7, 9, 2])
def test_idlg_infers_the_label_of_one_sample_exactly(label: int) -> None:
    model, x = sigmoid_lenet(seed=label), structured_image(10 + label)
    grads = client_gradient(model, x, torch.tensor([label]))
    assert infer_labels(grads[-2]).tolist() == [label]


@pytest.mark.parametrize("label", [0, 3, 9])
def test_idlg_reads_the_label_when_the_last_layer_sees_negative_features(label: int) -> None:
    """A linear layer before the last gives h = -1: the true class's row is then the only one summing
    above zero, and "the row that sums below zero" would name a wrong class."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 5), nn.Linear(5, NUM_CLASSES))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].bias.fill_(-1.0)
    grads = client_gradient(model, structured_image(label), torch.tensor([label]))
    row_sums = grads[-2].sum(dim=1)
    assert (row_sums > 0).nonzero().flatten().tolist() == [label]  # the paper's assumption h >= 0 fails
    assert infer_labels(grads[-2]).tolist() == [label]


def test_idlg_reads_every_label_off_the_dlg_variant_of_the_project_lenet() -> None:
    """lenet-fedmdcg-dlg's head is fc1 -> fc2 with no activation between: one image at a time, through
    `idlg_attack`'s own lookup of the last layer."""
    from fedistill.data.registry import load_dataset
    from fedistill.data.transforms import to_float
    from fedistill.models import build_model
    from fedistill.privacy.attacks import _labels_from_gradient

    digits = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model("lenet-fedmdcg-dlg", digits.info, norm="none")
    for i in range(10):
        x, y = to_float(digits.train.x[i : i + 1], digits.info), digits.train.y[i : i + 1]
        grads = client_gradient(model, x, y)
        assert _labels_from_gradient(model, grads, 10, x.shape, None).tolist() == y.tolist()


def test_idlg_reconstructs_with_the_inferred_label() -> None:
    model, x, y = sigmoid_lenet(), structured_image(3), torch.tensor([6])
    grads = client_gradient(model, x, y)
    result = idlg_attack(
        model,
        grads,
        x.shape,
        NUM_CLASSES,
        iterations=30,
        max_iter_per_step=10,
        generator=torch.Generator().manual_seed(0),
    )
    assert result.labels.tolist() == [6]
    assert result.soft_labels is None
    assert psnr(x, result.reconstruction).item() > 30.0


def test_batch_label_heuristic_returns_negative_rows() -> None:
    model = sigmoid_lenet()
    x = torch.cat([structured_image(20), structured_image(21)])
    grads = client_gradient(model, x, torch.tensor([8, 1]))
    assert sorted(infer_labels(grads[-2], batch_size=2).tolist()) == [1, 8]


def test_update_to_gradient_is_exact_for_one_sgd_step() -> None:
    model, x, y = sigmoid_lenet(), structured_image(4), torch.tensor([2])
    old = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    exact = {name: p.grad.clone() for name, p in model.named_parameters()}
    optimizer.step()
    estimate = update_to_gradient(old, model.state_dict(), lr=0.1, steps=1)
    assert estimate.keys() == exact.keys()
    for name, g in exact.items():
        torch.testing.assert_close(estimate[name], g, rtol=0, atol=1e-5)


def test_update_to_gradient_averages_several_steps() -> None:
    model = sigmoid_lenet()
    old = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    seen: list[list[torch.Tensor]] = []
    for step in range(3):
        optimizer.zero_grad()
        F.cross_entropy(model(structured_image(30 + step)), torch.tensor([step])).backward()
        seen.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    estimate = update_to_gradient(old, model.state_dict(), lr=0.05, steps=3)
    for (name, _), *per_step in zip(model.named_parameters(), *seen, strict=True):
        torch.testing.assert_close(estimate[name], torch.stack(per_step).mean(0), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="lr"):
        update_to_gradient(old, model.state_dict(), lr=0.0, steps=1)


def test_batchnorm_model_state_is_restored_and_buffers_in_dicts_are_skipped() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Sigmoid(), nn.Flatten())
    model.append(nn.Linear(4 * 64, NUM_CLASSES))
    x, y = torch.cat([structured_image(40), structured_image(41)]), torch.tensor([1, 7])
    old = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    observed = update_to_gradient(old, model.state_dict(), lr=0.1, steps=1)
    assert "1.running_mean" in observed and "1.num_batches_tracked" not in observed
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for mode in ("train", "eval"):
        result = dlg_attack(
            model, observed, x.shape, NUM_CLASSES, iterations=2, max_iter_per_step=2, mode=mode
        )
        assert result.reconstruction.shape == x.shape
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bad_gradients_are_named() -> None:
    model = sigmoid_lenet()
    grads = client_gradient(model, structured_image(5), torch.tensor([0]))
    with pytest.raises(ValueError, match="gradient tensors"):
        dlg_attack(model, grads[:-1], (1, 1, 8, 8), NUM_CLASSES, iterations=1)
    with pytest.raises(KeyError, match="nope"):
        dlg_attack(model, {"nope": grads[0]}, (1, 1, 8, 8), NUM_CLASSES, iterations=1)
    with pytest.raises(ValueError, match=r"0\.weight"):
        dlg_attack(model, {"0.weight": grads[0][:1]}, (1, 1, 8, 8), NUM_CLASSES, iterations=1)


def test_match_distance_is_squared_l2() -> None:
    a = [torch.tensor([1.0, 2.0]), torch.tensor([[0.0]])]
    b = [torch.tensor([0.0, 0.0]), torch.tensor([[3.0]])]
    assert match_distance(a, b).item() == pytest.approx(1 + 4 + 9)


# --- image metrics ---------------------------------------------------------------------------------


def noisy_batch(scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    clean = torch.rand(3, 1, 16, 16, generator=g)
    return clean, (clean + scale * torch.randn(clean.shape, generator=g)).clamp(0, 1)


def test_psnr_and_ssim_of_identical_images() -> None:
    clean, _ = noisy_batch(0.0)
    assert torch.isinf(psnr(clean, clean)).all()
    torch.testing.assert_close(ssim(clean, clean), torch.ones(3, dtype=torch.float64))
    assert psnr(clean.numpy(), clean.numpy() + 0.1).tolist() == pytest.approx([20.0] * 3)


def test_psnr_and_ssim_fall_with_noise() -> None:
    psnrs, ssims = [], []
    for scale in (0.01, 0.05, 0.2):
        clean, noisy = noisy_batch(scale)
        psnrs.append(psnr(clean, noisy).mean().item())
        ssims.append(ssim(clean, noisy).mean().item())
    assert psnrs[0] > psnrs[1] > psnrs[2]
    assert 1.0 > ssims[0] > ssims[1] > ssims[2]


def test_ssim_equals_scikit_image_gaussian_ssim() -> None:
    from skimage.metrics import structural_similarity

    rng = np.random.default_rng(3)
    clean = rng.random((2, 3, 18, 21))
    noisy = np.clip(clean + 0.1 * rng.standard_normal(clean.shape), 0, 1) * 2  # scale 2: data_range 2
    for sigma in (1.5, 1.0):
        ours = ssim(2 * clean, noisy, data_range=2.0, sigma=sigma).numpy()
        theirs = [
            structural_similarity(
                2 * c,
                n,
                data_range=2.0,
                channel_axis=0,
                gaussian_weights=True,
                sigma=sigma,
                use_sample_covariance=False,
            )
            for c, n in zip(clean, noisy, strict=True)
        ]
        np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)


def test_ssim_rejects_images_smaller_than_its_window() -> None:
    image = torch.rand(1, 1, 8, 8)
    with pytest.raises(ValueError, match="smaller sigma"):
        ssim(image, image)
    assert ssim(image, image, sigma=0.5).item() == pytest.approx(1.0)


def test_best_match_psnr_handles_permuted_batches() -> None:
    clean, noisy = noisy_batch(0.02)
    perm = torch.tensor([2, 0, 1])
    values, index = best_match_psnr(clean, noisy[perm])
    assert index.tolist() == perm.tolist()
    torch.testing.assert_close(values, psnr(clean, noisy)[perm])
    _, nearest = best_match_psnr(clean, noisy[torch.tensor([1, 1, 1, 0])], one_to_one=False)
    assert nearest.tolist() == [1, 1, 1, 0]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_image_metrics_refuse_nan_or_inf_by_name(bad: float) -> None:
    """PSNR and SSIM used to return NaN silently, and the best match failed inside SciPy's assignment."""
    clean, noisy = noisy_batch(0.02)
    broken = noisy.clone()
    broken[1, 0, 2, 2] = bad
    message = "{} holds NaN or infinite values \\(image 1 of the batch\\)"
    for metric in (psnr, ssim, best_match_psnr):
        with pytest.raises(ValueError, match="^" + message.format("reconstruction")):
            metric(clean, broken)
        with pytest.raises(ValueError, match="^" + message.format("reference")):
            metric(broken, clean)


def test_save_image_grid_writes_a_png(tmp_path: Path) -> None:
    images = np.random.default_rng(0).random((5, 1, 8, 8))
    path = save_image_grid(images, tmp_path / "grid" / "dlg.png", nrow=3, titles=[str(i) for i in range(5)])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="titles"):
        save_image_grid(images, tmp_path / "bad.png", nrow=3, titles=["a"])


def test_label_inference_refuses_a_batch_larger_than_the_classes_by_name() -> None:
    """iDLG reads at most one label per class; a larger batch used to fail with "got 10 labels for a
    batch of 12", which named labels the caller never passed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Sigmoid(), nn.Linear(8, 3))
    x = torch.cat([structured_image(50 + i) for i in range(4)])
    grads = client_gradient(model, x, torch.tensor([0, 1, 2, 0]))
    with pytest.raises(ValueError, match=r"a batch of 4 .* 3 classes; pass labels="):
        idlg_attack(model, grads, x.shape, 3, iterations=1)
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"batch_size must be >= 1, got {bad}"):
            infer_labels(grads[-2], batch_size=bad)


def test_a_num_classes_or_label_the_model_cannot_give_is_named() -> None:
    """These used to surface as torch's "size of tensor a (5) must match ..." and "Target 12 is out of
    bounds"."""
    model = sigmoid_lenet()
    grads = client_gradient(model, structured_image(6), torch.tensor([1]))
    with pytest.raises(ValueError, match=r"the model gives 10 outputs per input, but num_classes is 5"):
        dlg_attack(model, grads, (1, 1, 8, 8), 5, iterations=1)
    for bad in (12, -1):
        with pytest.raises(ValueError, match=rf"labels must be class indices in \[0, 10\), got \[{bad}\]"):
            idlg_attack(model, grads, (1, 1, 8, 8), NUM_CLASSES, iterations=1, labels=torch.tensor([bad]))


def test_label_inference_on_hand_built_last_layer_gradients() -> None:
    """Row c of the last layer's weight gradient is (p_c - y_c) h for one sample (softmax cross-entropy);
    built by hand here with features of both signs."""
    h = torch.tensor([1.0, -2.0, 0.5])
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    for label in range(4):
        y = F.one_hot(torch.tensor(label), 4).float()
        grad = (p - y)[:, None] * h[None, :]  # row sums: (p_c - y_c) * -0.5, so the true row sums > 0
        assert int(grad.sum(dim=1).argmax()) == label  # "the row that sums below zero" fails here
        assert infer_labels(grad).tolist() == [label]
    # two classes: the rows are opposite, so the paper's rule (the negative row sum) decides
    grad = (torch.tensor([0.3, 0.7]) - torch.tensor([0.0, 1.0]))[:, None] * torch.tensor([[1.0, 2.0]])
    assert infer_labels(grad).tolist() == [1]
    # a batch of 2: the two most negative row sums, most negative first
    grad = torch.tensor([[0.2, 0.1], [-0.5, -0.4], [0.3, 0.0], [-0.1, -0.1]])
    assert infer_labels(grad, batch_size=2).tolist() == [1, 3]


def test_scores_summarise_and_pool_by_hand() -> None:
    """Means and population spreads per attack; pooled label accuracy weighted by each client's images."""
    from fedistill.analysis.inversion_scores import Score, merge

    a = Score([10.0, 30.0], [0.2, 0.4], label_accuracy=0.5, distance=1.0)
    b = Score([20.0], [0.9], label_accuracy=1.0, distance=3.0, note="diverged")
    pooled = merge([a, b])
    assert pooled.psnr == [10.0, 30.0, 20.0] and pooled.label_accuracy == pytest.approx(2 / 3)
    assert pooled.distance == 2.0 and pooled.note == "diverged" and pooled.reconstruction is None
    summary = a.summary()
    assert summary["psnr_mean"] == 20.0 and summary["psnr_std"] == 10.0  # ddof 0
    assert summary["ssim_mean"] == pytest.approx(0.3) and summary["ssim_std"] == pytest.approx(0.1)
    assert Score([], [], note="n/a: x").summary()["psnr_mean"] is None


def test_a_step_size_or_labels_that_cannot_work_are_named() -> None:
    """lr = 0 used to run to a "result" that never moved from the random start, and float labels were
    truncated (1.7 -> class 1) without a word."""
    model = sigmoid_lenet()
    grads = client_gradient(model, structured_image(7), torch.tensor([1]))
    for lr in (0.0, math.nan):
        with pytest.raises(ValueError, match=f"lr must be > 0, got {lr}"):
            dlg_attack(model, grads, (1, 1, 8, 8), NUM_CLASSES, iterations=1, lr=lr)
    with pytest.raises(ValueError, match=r"labels must be integer class indices, got torch.float32"):
        idlg_attack(model, grads, (1, 1, 8, 8), NUM_CLASSES, iterations=1, labels=torch.tensor([1.7]))


def test_batch_label_inference_gives_the_batch_size_most_negative_rows_as_idlg_uses() -> None:
    """`infer_labels(grad, B)` returned every class with a negative row sum (2 here, for a batch of 3)
    while `idlg_attack` took the B most negative; both now give the B most negative, most negative first."""
    from fedistill.privacy.attacks import _labels_from_gradient

    # row sums -3, 1, -1, 2: classes 0 and 2 sum below zero; a batch of 3 needs one more, class 1
    grad = torch.tensor([[-2.0, -1.0], [0.5, 0.5], [-1.5, 0.5], [1.0, 1.0]])
    assert infer_labels(grad, batch_size=3).tolist() == [0, 2, 1]
    assert infer_labels(grad, batch_size=2).tolist() == [0, 2]
    model = nn.Linear(2, 4, bias=False)
    for batch in (2, 3, 4):
        expected = infer_labels(grad, batch_size=batch).tolist()
        assert _labels_from_gradient(model, [grad], 4, (batch, 2), None).tolist() == expected
    with pytest.raises(ValueError, match=r"a batch of 5 is larger than the 4 classes"):
        infer_labels(grad, batch_size=5)


class _HeadFirst(nn.Module):
    """A hidden layer as wide as the classes, registered after the classifier: the last 2-D parameter with
    NUM_CLASSES rows is then the hidden layer's, not the classifier's."""

    def __init__(self, functional_head: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.functional_head = functional_head
        if functional_head:
            self.head = nn.Parameter(torch.randn(NUM_CLASSES, NUM_CLASSES) * 0.3)
        else:
            self.classifier = nn.Linear(NUM_CLASSES, NUM_CLASSES)
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(64, NUM_CLASSES), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        return F.linear(h, self.head) if self.functional_head else self.classifier(h)


def test_idlg_reads_the_label_off_the_layer_that_gives_the_outputs() -> None:
    """iDLG took the last 2-D gradient with NUM_CLASSES rows, here a hidden layer, and read wrong labels;
    it now reads the layer whose output is the model's output."""
    from fedistill.privacy.attacks import _labels_from_gradient

    model = _HeadFirst()
    shape = (1, 1, 8, 8)
    for label in range(NUM_CLASSES):
        grads = client_gradient(model, structured_image(60 + label), torch.tensor([label]))
        assert _labels_from_gradient(model, grads, NUM_CLASSES, shape, None).tolist() == [label]
    # a reply without the output layer holds no label, even with another NUM_CLASSES-row gradient in it
    named = dict(zip((n for n, _ in model.named_parameters()), grads, strict=True))
    hidden = {n: g for n, g in named.items() if n.startswith("features.")}
    with pytest.raises(NoLastLayerError, match=r"classifier\.weight"):
        idlg_attack(model, hidden, shape, NUM_CLASSES, iterations=1)


def test_idlg_refuses_to_guess_between_several_possible_last_layers() -> None:
    """When no layer's output is the model's output (a functional head) and two gradients have
    NUM_CLASSES rows, the lookup names both and asks for last_weight= instead of taking the last one."""
    from fedistill.privacy.attacks import _labels_from_gradient

    model = _HeadFirst(functional_head=True)
    shape = (1, 1, 8, 8)
    grads = client_gradient(model, structured_image(70), torch.tensor([4]))
    with pytest.raises(ValueError, match=r"'head', 'features\.1\.weight'.*pass last_weight="):
        _labels_from_gradient(model, grads, NUM_CLASSES, shape, None)
    assert _labels_from_gradient(model, grads, NUM_CLASSES, shape, "head").tolist() == [4]
