"""The scheduler package must not import jax or torch (it is framework-agnostic)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('jax', 'jaxlib', 'torch', 'flax', 'triton'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import scheduler, scheduler.books, scheduler.core, scheduler.interface, scheduler.prefill, scheduler.prefix_cache
import scheduler.slots, scheduler.validation, rwkv7_core.sampling
from scheduler import generate, Request, SamplingParams, SchedulerConfig
from tests.support.scheduler_engines import FakeEngine
out = generate(FakeEngine(), [Request('a', [1, 2, 3], SamplingParams(max_tokens=4))], SchedulerConfig(max_batch=2))
assert out[0].generated_tokens >= 1, out
bad = [m for m in sys.modules if m.split('.')[0] in ('jax', 'torch', 'flax', 'triton')]
assert not bad, bad
print('ok')
"""


def test_scheduler_imports_neither_jax_nor_torch():
    result = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
