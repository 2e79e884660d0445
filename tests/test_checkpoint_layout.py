"""Checkpoints keep memory layouts: a restored tensor has the strides of the one that was saved.

Values alone are not enough for a bit-identical resume. A (32, 1, 8, 8) batch with strides
(64, 1, 8, 1) counts as both contiguous and channels-last, and a convolution picks a channels-last
kernel for it that rounds differently from the one it picks for strides (64, 64, 8, 1), on some CPUs.
FedMD-CG's cache of augmented batches held such tensors; restored with default strides, the resumed
run drifted in the 7th digit from the uninterrupted one.
"""

import torch

from fedistill.engine.checkpoint import load_state, save_state


def _strided(values: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    out = torch.empty_strided(values.shape, stride, dtype=values.dtype)
    return out.copy_(values)


def test_layouts_survive_a_round_trip(tmp_path):
    torch.manual_seed(0)
    batch = torch.randint(0, 255, (32, 1, 8, 8), dtype=torch.uint8)
    state = {
        "ambiguous": _strided(batch, (64, 1, 8, 1)),  # contiguous and channels-last at once
        "channels_last": torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last),
        "transposed": torch.randn(3, 7).t().clone(),
        "plain": torch.randn(2, 3),
        "scalar": torch.tensor(3.0),
        "empty": torch.empty(0, 3),
    }
    save_state(state, tmp_path / "state")
    restored = load_state(tmp_path / "state")
    for name, tensor in state.items():
        assert restored[name].dtype == tensor.dtype, name
        assert restored[name].shape == tensor.shape, name
        assert restored[name].stride() == tensor.stride(), name
        assert torch.equal(restored[name], tensor), name


def test_a_restored_batch_convolves_to_the_same_bits(tmp_path):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(1, 6, 5, padding=2)
    batch = _strided(torch.rand(32, 1, 8, 8), (64, 1, 8, 1))
    save_state({"x": batch}, tmp_path / "state")
    restored = load_state(tmp_path / "state")["x"]
    with torch.no_grad():
        assert torch.equal(conv(restored), conv(batch))


def test_views_are_saved_as_the_copy_a_clone_would_make(tmp_path):
    """A strided view (every other row) is not dense: like `clone()`, the checkpoint keeps it contiguous."""
    base = torch.arange(20.0).reshape(10, 2)
    view = base[::2]
    save_state({"view": view}, tmp_path / "state")
    restored = load_state(tmp_path / "state")["view"]
    assert torch.equal(restored, view) and restored.stride() == view.clone().stride() == (2, 1)
