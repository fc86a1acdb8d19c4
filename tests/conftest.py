"""Test setup: 8 fake CPU devices for the sharding tests.

XLA reads the flag once, when the backend starts, so it must be set before
anything imports jax.
"""

import os

# The CPU thunk trace flag lets the benchmark's --profile test see XLA's ops
# (jaxtl.profiling.CPU_TRACE_FLAG; nothing is recorded while no trace runs).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8"
                           + " --xla_cpu_enable_xprof_traceme=true")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Readers take the data folder from $JAXTL_DATA_DIR; default it to the shared
# copy beside the repository when there is one (tests skip without it).
_shared = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
if "JAXTL_DATA_DIR" not in os.environ and os.path.isdir(_shared):
  os.environ["JAXTL_DATA_DIR"] = os.path.abspath(_shared)
