"""Test setup: 8 fake CPU devices for the sharding tests.

XLA reads the flag once, when the backend starts, so it must be set before
anything imports jax.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
