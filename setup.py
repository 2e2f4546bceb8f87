"""Installs the lra_msmra package (dependencies are pinned in requirements.txt)."""

import setuptools

setuptools.setup(
    name='lra_msmra',
    version='0.1.0',
    description='Multi-scale multi-range attention (CST, Transformer-LS, '
                'AdaMRA, Combiner) on the Long Range Arena, in JAX/Flax.',
    packages=setuptools.find_packages(include=['lra_msmra', 'lra_msmra.*']),
    python_requires='>=3.10',
    install_requires=[
        'jax', 'flax', 'optax', 'chex', 'orbax-checkpoint', 'ml_collections',
        'absl-py', 'numpy', 'tensorboardX',
        # Text, Image and Pathfinder data (imported lazily).
        'tensorflow-datasets', 'tensorflow-cpu',
    ],
)
