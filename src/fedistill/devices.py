"""Where tensors compute: the run's one `device` setting (auto | cpu | cuda | cuda:N | mps).

The policy that keeps every device giving the same run for a seed, and a checkpoint loadable anywhere:

- random numbers are always drawn on the CPU (`seeding.torch_generator` streams) and then moved, so the
  order of samples, the augmentation and the synthetic noise are the same on every device;
- data sets stay in memory on the CPU; a batch moves to the device when it is made;
- models live on the device; messages carry NumPy arrays (`Message.build` copies tensors to the CPU),
  and `Message.tensor` hands a received array back on the device;
- checkpoints are written from the CPU and loaded onto whatever device the resumed run uses.

Same seed, same device: same run (CUDA runs set PyTorch's deterministic algorithms). Different devices
round differently, so their runs agree only within floating-point tolerance.
"""

from __future__ import annotations

import os
import re

import torch

from fedistill.errors import ConfigError

_current = torch.device("cpu")

DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def resolve(name: str | torch.device) -> torch.device:
    """The torch device `name` asks for; `auto` takes CUDA, else Apple's MPS, else the CPU. A device this
    machine does not have is a ConfigError that says what it has; a torch.device is checked as its name."""
    if isinstance(name, torch.device):
        name = str(name)
    if not isinstance(name, str) or not DEVICE_PATTERN.match(name.strip()):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps, got {name!r}")
    name = name.strip()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {name!r}: this machine has no CUDA device; use device = 'cpu' or 'auto' "
                "(a resumed run: --resume RUN --device cpu)"
            )
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                f"numbered from 0"
            )
    if name == "mps" and not _mps_available():
        raise ConfigError("device 'mps': this machine has no Apple MPS device; use device = 'cpu' or 'auto'")
    return torch.device(name)


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def use(device: torch.device | str) -> torch.device:
    """Make `device` the current one (a name is resolved first); CUDA gets deterministic algorithms, so
    one seed gives one run on one device."""
    global _current
    _current = resolve(device) if isinstance(device, str) else torch.device(device)
    if _current.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    return _current


def current() -> torch.device:
    """The device models and batches use now (the CPU until a run picks one)."""
    return _current


def describe() -> str:
    """The current device as a run's log and summary name it: `cpu`, or `cuda:0 (NVIDIA H200)` with the
    card, so that a GPU run's record says which card it ran on."""
    if _current.type != "cuda":
        return str(_current)
    return f"{_current} ({torch.cuda.get_device_name(_current)})"


def on_device(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the current device (itself when it is there already)."""
    return tensor if tensor.device == _current else tensor.to(_current)
