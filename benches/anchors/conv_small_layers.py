#!/usr/bin/env python3
"""PyTorch (oneDNN) per-pass anchors for the small layers of the framework's CIFAR/MNIST training
runs: ResNet-20's 3x3 layers (batch 128) with its stride-2 and 1x1 stride-2 projection layers,
and LeNet-5's two 5x5 layers (batch 64). Same measurement as the shared anchor
`conv_layers.py` (forward, backward-data, backward-weight, no bias), whose `main` this reuses
with its layer table replaced; the names match `benches/benches/conv.rs`.

  /tmp/anchor-venv/bin/python benches/anchors/conv_small_layers.py --threads 1 --variants nchw --no-wait \
      [--layers rn20_16_32,lenet_c1,...]
"""
import os
import sys

ANCHORS = os.environ.get("CONV_ANCHORS", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "..", "..", "..", "shared", "anchors", "conv"))
sys.path.insert(0, ANCHORS)
import conv_layers  # noqa: E402

# name, N, C, K, input spatial, kernel, stride, pad
conv_layers.LAYERS = [
    ("rn20_3to16_32",   128,  3, 16, (32, 32), (3, 3), 1, 1),
    ("rn20_16_32",      128, 16, 16, (32, 32), (3, 3), 1, 1),
    ("rn20_32_16",      128, 32, 32, (16, 16), (3, 3), 1, 1),
    ("rn20_64_8",       128, 64, 64, (8, 8),   (3, 3), 1, 1),
    ("rn20_s2_16to32",  128, 16, 32, (32, 32), (3, 3), 2, 1),
    ("rn20_s2_32to64",  128, 32, 64, (16, 16), (3, 3), 2, 1),
    ("rn20_1x1s2_16to32", 128, 16, 32, (32, 32), (1, 1), 2, 0),
    ("rn20_1x1s2_32to64", 128, 32, 64, (16, 16), (1, 1), 2, 0),
    ("lenet_c1",         64,  1,  6, (28, 28), (5, 5), 1, 2),
    ("lenet_c2",         64,  6, 16, (14, 14), (5, 5), 1, 0),
]
conv_layers.GROUPS = {"rn20": "rn20_", "lenet": "lenet_"}

if __name__ == "__main__":
    conv_layers.main()
