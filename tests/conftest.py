"""Test-wide settings: 8 fake CPU devices and fast compiles.

XLA_FLAGS must be set before jax is imported anywhere, hence here.
"""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_disable_most_optimizations', True)
jax.config.update('jax_threefry_partitionable', True)
