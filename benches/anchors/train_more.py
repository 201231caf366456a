#!/usr/bin/env python3
"""PyTorch training anchors for the `train` models the shared anchor `train_bench.py` does not
define: torchvision's ResNet-18 / ResNet-50 / VGG-11 (`vgg-a`) on 3x224x224 inputs, and C3D on
3x16x112x112 clips. Same measurement as `train_bench.py` (synthetic batch, SGD step, median and
best step time, peak RSS), whose `main` this reuses with its model table extended, as
`conv_small_layers.py` does for `conv_layers.py`. The definitions match `nn::model::build_with`.

  /tmp/anchor-venv/bin/python benches/anchors/train_more.py --model c3d --threads 1 --no-wait --steps 3 --warmup 1

`--channels-last` runs PyTorch in its channels-last layout (channels_last_3d for C3D), which
oneDNN prefers on AVX-512 CPUs.
"""
import argparse
import os
import sys

ANCHORS = os.environ.get("CONV_ANCHORS", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "..", "..", "..", "shared", "anchors", "conv"))
sys.path.insert(0, ANCHORS)
import train_bench  # noqa: E402

# model: (sample shape, classes, default batch)
MORE = {
    "resnet18": ((3, 224, 224), 1000, 8),
    "resnet50": ((3, 224, 224), 1000, 8),
    "vgg-a": ((3, 224, 224), 1000, 4),
    "c3d": ((3, 16, 112, 112), 487, 2),
}


def c3d(torch, classes):
    """C3D (Tran et al. 2015) as `nn` builds it: eight 3x3x3 convolutions (pad 1) with ReLU,
    max-pools 1x2x2 then 2x2x2 (the last padded 0x1x1), fc6 8192->4096, fc7 4096->4096 (ReLU,
    dropout 0.5), fc8 4096->classes."""
    nn = torch.nn
    stages = [([64], (1, 2, 2), 0), ([128], (2, 2, 2), 0), ([256, 256], (2, 2, 2), 0),
              ([512, 512], (2, 2, 2), 0), ([512, 512], (2, 2, 2), (0, 1, 1))]
    layers, cin = [], 3
    for widths, pool, pad in stages:
        for cout in widths:
            layers += [nn.Conv3d(cin, cout, 3, padding=1), nn.ReLU(inplace=True)]
            cin = cout
        layers.append(nn.MaxPool3d(pool, pool, padding=pad))
    layers += [nn.Flatten(), nn.Linear(8192, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
               nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
               nn.Linear(4096, classes)]
    return nn.Sequential(*layers)


def build(torch, name):
    if name not in MORE:
        return shared_build(torch, name)
    shape, classes, batch = MORE[name]
    if name == "c3d":
        return c3d(torch, classes), shape, classes, batch
    import torchvision
    ctor = {"resnet18": torchvision.models.resnet18, "resnet50": torchvision.models.resnet50,
            "vgg-a": torchvision.models.vgg11}[name]
    return ctor(weights=None, num_classes=classes), shape, classes, batch


shared_build = train_bench.build
train_bench.build = build

# train_bench's parser lists its own models as the choices of --model: widen them.
_add_argument = argparse.ArgumentParser.add_argument


def add_argument(self, *args, **kwargs):
    if "--model" in args and "choices" in kwargs:
        kwargs["choices"] = list(kwargs["choices"]) + list(MORE)
    return _add_argument(self, *args, **kwargs)


argparse.ArgumentParser.add_argument = add_argument

if __name__ == "__main__":
    if "c3d" in sys.argv and "--channels-last" in sys.argv:
        # train_bench converts with torch.channels_last, which needs 4-D tensors: C3D's clips and
        # weights are 5-D, whose channels-last format is channels_last_3d.
        import torch
        torch.channels_last = torch.channels_last_3d
    train_bench.main()
