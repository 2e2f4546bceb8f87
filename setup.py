"""Installs the lra_msmra package (dependencies are pinned in requirements.txt)."""

import os

import setuptools


def _requirements(name):
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
  with open(path, encoding='utf-8') as f:
    return [line.split('#', 1)[0].strip() for line in f
            if line.split('#', 1)[0].strip()]


# Optional: only the compile tool needs them (docs/scaling.md).
COMPILE_REQUIREMENTS = _requirements('requirements-compile.txt')
# Optional: only the real IMDb and CIFAR-10 data.
TFDS_REQUIREMENTS = _requirements('requirements-tfds.txt')

setuptools.setup(
    name='lra_msmra',
    version='0.1.0',
    description='Multi-scale multi-range attention (CST, Transformer-LS, '
                'AdaMRA, Combiner) on the Long Range Arena, in JAX/Flax.',
    packages=setuptools.find_packages(
        include=['lra_msmra', 'lra_msmra.*', 'lra_msmra_tools',
                 'lra_msmra_tools.*']),
    python_requires='>=3.10',
    install_requires=[
        'jax', 'flax', 'optax', 'chex', 'orbax-checkpoint', 'ml_collections',
        'absl-py', 'numpy', 'tensorboardX',
        # Decodes the Pathfinder PNGs (imported lazily).
        'pillow',
    ],
    extras_require={
        # Compile for TPU and GPU on a CPU (python -m lra_msmra_tools.compile):
        # the same pins as requirements-compile.txt.
        'compile': COMPILE_REQUIREMENTS,
        # TensorFlow and TFDS: the real IMDb and CIFAR-10 data (python -m
        # lra_msmra.data.prepare --tfds, tfds.load): the same pins as
        # requirements-tfds.txt.
        'tfds': TFDS_REQUIREMENTS,
    },
)
