"""The H200 target of the deviceless-compile tests (not a test module).

The CUDA plugin comes from $RWKV7_CUDA_PLUGIN_DIR (set by `make test`), else from
.venv/cuda-plugin of the checkout; without it these tests fail (they never skip)."""
import os
from pathlib import Path

from rwkv_jax import deviceless

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIR = os.environ.get(deviceless.PLUGIN_DIR_ENV) or str(ROOT / ".venv" / "cuda-plugin")
H200 = deviceless.load_target("h200")


def engine(config, dtype: str, kernels: str):
    """A JaxEngine of abstract weights placed on the H200."""
    return deviceless.abstract_engine(config, dtype, kernels, H200, plugin_dir=PLUGIN_DIR)


def sharding():
    return deviceless.target_device(H200, plugin_dir=PLUGIN_DIR)


def assert_pallas_resources_reported(report) -> None:
    """ptxas ran and gave registers for every Pallas kernel: a blind report must fail, not pass."""
    assert report.ptxas_error is None, report.ptxas_error
    pallas = [k for k in report.kernels if k.name.startswith("rwkv7")]
    assert pallas and all(k.registers for k in pallas), [k.as_dict() for k in pallas if not k.registers]
