#!/bin/sh
# Training throughput of `train` against PyTorch's (the anchors' train_bench.py), 1 thread (or
# THREADS), back to back, so each ratio pairs measurements taken within a minute of each other.
#   cargo build --release -p examples --bin train
#   scripts/train_vs_pytorch.sh [lenet resnet20 vgg16 resnet34]
#   scripts/train_vs_pytorch.sh resnet18 resnet50 vgg-a c3d    # 224² ImageNet models, C3D clips
# PYTHON (default python3) needs torch (and torchvision for the torchvision models); ANCHORS points
# to the anchors' directory (default ../shared/anchors/conv); TRAIN to the binary
# (target/release/train). The models the shared train_bench.py lacks are measured by
# benches/anchors/train_more.py, which reuses its measurement.
set -e
P=${PYTHON:-python3}
A=${ANCHORS:-../shared/anchors/conv}/train_bench.py
M=$(dirname "$0")/../benches/anchors/train_more.py
T=${TRAIN:-target/release/train}
N=${THREADS:-1}
j() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print('ours', d['model'], d['conv_algo'], 'samples/s', float('%.4g' % d['samples_per_sec']), 'peakRSS MiB', d['peak_rss_bytes']>>20)"; }
ours() { # model batch steps
    $T --model "$1" --dataset synthetic --batch-size "$2" --steps "$3" --threads $N --json | j
    $T --model "$1" --dataset synthetic --batch-size "$2" --steps "$3" --threads $N --conv-algo convgemm --json | j
}
date -u +%T; cat /proc/loadavg
for m in ${*:-lenet resnet20 vgg16 resnet34}; do
    case $m in
    lenet) $P $A --model lenet --threads $N --no-wait --min-time 5 2>&1 | grep "^lenet"; ours lenet 64 300 ;;
    resnet20) $P $A --model resnet20 --threads $N --no-wait --min-time 8 2>&1 | grep "^resnet20"; ours resnet20 64 14 ;;
    vgg16) $P $A --model vgg16 --threads $N --no-wait --steps 4 --warmup 1 2>&1 | grep "^vgg16"; ours vgg16 64 6 ;;
    resnet34) $P $A --model resnet34 --threads $N --no-wait --steps 3 --warmup 1 2>&1 | grep "^resnet34"; ours resnet34 8 5 ;;
    resnet18 | resnet50) CONV_ANCHORS=$(dirname "$A") $P $M --model $m --threads $N --no-wait --steps 3 --warmup 1 2>&1 | grep "^$m"; ours $m 8 5 ;;
    vgg-a) CONV_ANCHORS=$(dirname "$A") $P $M --model vgg-a --threads $N --no-wait --steps 3 --warmup 1 2>&1 | grep "^vgg-a"; ours vgg-a 4 5 ;;
    c3d) CONV_ANCHORS=$(dirname "$A") $P $M --model c3d --threads $N --no-wait --steps 3 --warmup 1 2>&1 | grep "^c3d"; ours c3d 2 4 ;;
    *) echo "unknown model $m" >&2; exit 1 ;;
    esac
done
date -u +%T
