"""``python -m scheduler``: the batch generation command (same as ``rwkv7-generate``)."""
import sys

from .cli import main

sys.exit(main())
