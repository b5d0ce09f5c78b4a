"""The framework-free foundation every other package builds on (numpy only).

Model configuration and named shapes (``config``), checkpoint I/O (``checkpoint``) and
seeded random weights (``random_weights``), the model's constants (``constants``), the
World tokenizer (``tokenizer``), sampling parameters with the numpy sampling reference
(``sampling``), the recurrent state's layout (``state``), sequence states as files and
tuned-state files (``state_files``) and the engine contract (``engine``). It imports no other project package.
"""
from .checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from .config import NAMED_CONFIGS, ModelConfig, named_config
from .random_weights import random_tensors, write_random_checkpoint
from .sampling import SamplingParams

__all__ = ["CheckpointError", "ModelConfig", "NAMED_CONFIGS", "SamplingParams", "named_config",
           "random_tensors", "read_checkpoint", "write_checkpoint", "write_random_checkpoint"]
