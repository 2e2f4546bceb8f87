r"""Image (CIFAR-10) with Sinkhorn attention (`sinkhorn`, arXiv:2002.11296).

  python -m lra_msmra.main --config configs/image/sinkhorn.py:runlocal \
      --workdir /tmp/image_sinkhorn

Options: see base.py; what they mean for every task:
configs/common/sinkhorn.py.

  (none)  the official image/configs/cifar10/sinkhorn_base.py: blocks of 64,
          1 layer, 1 head, D = 32, MLP 64, dropout 0.1, weight decay 0.7
          (the CIFAR base sizes, not the Transformer's); 52,810 parameters,
          21.3% of the LRA Transformer's. LRA leaderboard: 41.23.
"""

from lra_msmra import config_lib

base = config_lib.load_sibling(__file__, 'base')
common = config_lib.load_sibling(__file__, '../common/sinkhorn')


def get_config(arg=None):
  # Official image/configs/cifar10/sinkhorn_base.py: block 64, 1 layer,
  # dropout 0.1, weight decay 0.7; it leaves the sizes at the CIFAR base
  # config's (D = 32, 1 head, qkv 32, MLP 64), not the Transformer's.
  return common.task_config(base, arg, block_size=64, weight_decay=0.7,
                            num_layers=1, num_heads=1, emb_dim=32, qkv_dim=32,
                            mlp_dim=64, dropout_rate=0.1)
