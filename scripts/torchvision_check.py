#!/usr/bin/env python3
"""Our models against PyTorch's definitions: same weights, same input, evaluation-mode logits.

For each model, builds PyTorch's (torchvision's resnet18/34/50 and vgg11 = `vgg-a`; C3D written
below, as in Tran et al. 2015), gives its batch norms random statistics and affine parameters,
saves the state_dict as safetensors (PyTorch's names are ours), runs `predict` on the same
input, and prints the largest difference relative to max |logit|. Exits non-zero above 1e-4.

  cargo build --release -p examples --bin predict
  python3 scripts/torchvision_check.py [--predict target/release/predict] [--models resnet18,...]

Needs torch, torchvision and safetensors (pip install torch torchvision safetensors).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file


def c3d(classes=487):
    class C3D(nn.Module):
        def __init__(self):
            super().__init__()
            conv = lambda i, o: nn.Conv3d(i, o, 3, padding=1)  # noqa: E731
            self.conv1, self.conv2 = conv(3, 64), conv(64, 128)
            self.conv3a, self.conv3b = conv(128, 256), conv(256, 256)
            self.conv4a, self.conv4b = conv(256, 512), conv(512, 512)
            self.conv5a, self.conv5b = conv(512, 512), conv(512, 512)
            self.pool1 = nn.MaxPool3d((1, 2, 2), (1, 2, 2))
            self.pool = nn.MaxPool3d(2, 2)
            self.pool5 = nn.MaxPool3d(2, 2, padding=(0, 1, 1))
            self.fc6, self.fc7, self.fc8 = nn.Linear(8192, 4096), nn.Linear(4096, 4096), nn.Linear(4096, classes)

        def forward(self, x):
            r = torch.relu
            x = self.pool1(r(self.conv1(x)))
            x = self.pool(r(self.conv2(x)))
            x = self.pool(r(self.conv3b(r(self.conv3a(x)))))
            x = self.pool(r(self.conv4b(r(self.conv4a(x)))))
            x = self.pool5(r(self.conv5b(r(self.conv5a(x)))))
            x = r(self.fc6(x.flatten(1)))
            return self.fc8(r(self.fc7(x)))  # dropout is the identity in evaluation

    return C3D()


def build(name):
    import torchvision
    if name == "vgg-a":
        return torchvision.models.vgg11(), (1, 3, 224, 224)
    if name == "c3d":
        return c3d(), (1, 3, 16, 112, 112)
    return getattr(torchvision.models, name)(), (2, 3, 96, 80)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--predict", default="target/release/predict")
    ap.add_argument("--models", default="resnet18,resnet34,resnet50,vgg-a,c3d")
    args = ap.parse_args()
    torch.manual_seed(0)
    worst = 0.0
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            model, shape = build(name)
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 2.0)
                    m.weight.data.uniform_(0.5, 1.5)
                    m.bias.data.uniform_(-0.5, 0.5)
            model.eval()
            x = torch.randn(*shape)
            with torch.no_grad():
                want = model(x)
            sd = {k: v.contiguous() for k, v in model.state_dict().items() if v.dtype == torch.float32}
            ckpt, inp, out = (os.path.join(d, f) for f in ("ckpt.safetensors", "x.safetensors", "y.safetensors"))
            save_file(sd, ckpt, metadata={"epoch": "0", "step": "0"})
            save_file({"x": x}, inp)
            subprocess.run([args.predict, "--model", name, "--checkpoint", ckpt, "--input", inp,
                            "--output", out, "--conv-algo", "convgemm"], check=True)
            got = load_file(out)["logits"]
            err = ((got - want).abs().max() / want.abs().max()).item()
            worst = max(worst, err)
            print(f"{name:9} input {list(shape)} logits {list(want.shape)}: max |ours - PyTorch| / max |PyTorch| = {err:.2e}")
    sys.exit(0 if worst < 1e-4 else 1)


if __name__ == "__main__":
    main()
