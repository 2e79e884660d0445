import os
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
# Tiny models: one thread is as fast and immune to oversubscription. Set, not defaulted: the runs that tests
# start as processes (threads = 0: torch's default, from this variable) must do the arithmetic of the runs
# in this one, which an exported OMP_NUM_THREADS=4 changed in the last bits. MKL_NUM_THREADS too: torch reads
# it after OMP_NUM_THREADS, so an exported MKL_NUM_THREADS=4 gave a child process 4 threads.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import torch

torch.set_num_threads(1)
pytest.register_assert_rewrite("algorithm_helpers")  # its asserts report values like a test's

#: The dataset files: FEDISTILL_SHARED_DATA, else FEDISTILL_DATA (the folder `fedistill reproduce` reads),
#: else the shared folder beside the checkout
SHARED_DATA = Path(
    os.environ.get("FEDISTILL_SHARED_DATA")
    or os.environ.get("FEDISTILL_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "data"
)


@pytest.fixture
def shared_data() -> Path:
    """The folder with the MNIST and Fashion-MNIST originals, or skip when this machine lacks it."""
    if not (SHARED_DATA / "mnist" / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"MNIST files not found under {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(autouse=True, scope="module")
def _model_registry_per_module():
    """Models a test module registers (e.g. the attack benchmark's variants) do not leak into others."""
    from fedistill.models import registry

    before = dict(registry._MODELS)
    yield
    registry._MODELS.clear()
    registry._MODELS.update(before)


def read_only_below(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Make every atomic write under `root` fail as a read-only mount does (EROFS), which chmod cannot show
    to root; writes elsewhere go through."""
    import errno

    from fedistill import disk

    real = disk.write_bytes

    def read_only(path: Path, data: bytes) -> None:
        if Path(path).is_relative_to(root):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        real(path, data)

    monkeypatch.setattr(disk, "write_bytes", read_only)
