#!/bin/sh
# Training throughput of `train` against PyTorch's (the anchors' train_bench.py), 1 thread (or
# THREADS), back to back, so each ratio pairs measurements taken within a minute of each other.
#   cargo build --release -p examples --bin train
#   scripts/train_vs_pytorch.sh [lenet resnet20 vgg16 resnet34]
#   scripts/train_vs_pytorch.sh resnet18 resnet50 vgg-a c3d    # 224² ImageNet models, C3D clips
# PYTHON (default python3) needs torch (and torchvision for the torchvision models); ANCHORS points
# to the anchors' directory (default ../shared/anchors/conv); TRAIN to the binary
# (target/release/train). Ours prints the mean rate of the timed steps and the median step's rate
# (`median`), to set beside PyTorch's `med`. The models the shared train_bench.py lacks are measured by
# benches/anchors/train_more.py, which reuses its measurement. With CL=1 PyTorch also runs each model
# in its channels-last layout (a second PyTorch line, `cl=1`): oneDNN's fast layout on AVX-512.
set -e
P=${PYTHON:-python3}
A=${ANCHORS:-../shared/anchors/conv}/train_bench.py
M=$(dirname "$0")/../benches/anchors/train_more.py
export CONV_ANCHORS="$(dirname "$A")"
T=${TRAIN:-target/release/train}
N=${THREADS:-1}
# PyTorch's layouts: the default (NCHW) and, with CL=1, channels-last too.
L=""
[ "${CL:-0}" = 1 ] && L="--channels-last"
pt() { # script model args...: one line per layout
    s=$1; m=$2; shift 2
    for l in "" $L; do $P $s --model $m --threads $N --no-wait $l "$@" 2>&1 | grep "^$m"; done
}
j() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print('ours', d['model'], d['conv_algo'], 'samples/s', float('%.4g' % d['samples_per_sec']), 'median', float('%.4g' % d['median_samples_per_sec']), 'peakRSS MiB', d['peak_rss_bytes']>>20)"; }
ours() { # model batch steps
    $T --model "$1" --dataset synthetic --batch-size "$2" --steps "$3" --threads $N --json | j
    $T --model "$1" --dataset synthetic --batch-size "$2" --steps "$3" --threads $N --conv-algo convgemm --json | j
}
date -u +%T; cat /proc/loadavg
for m in ${*:-lenet resnet20 vgg16 resnet34}; do
    case $m in
    lenet) pt $A lenet --min-time 5; ours lenet 64 300 ;;
    resnet20) pt $A resnet20 --min-time 8; ours resnet20 64 14 ;;
    vgg16) pt $A vgg16 --steps 4 --warmup 1; ours vgg16 64 6 ;;
    resnet34) pt $A resnet34 --steps 3 --warmup 1; ours resnet34 8 5 ;;
    resnet18 | resnet50) pt $M $m --steps 3 --warmup 1; ours $m 8 5 ;;
    vgg-a) pt $M vgg-a --steps 3 --warmup 1; ours vgg-a 4 5 ;;
    c3d) pt $M c3d --steps 3 --warmup 1; ours c3d 2 4 ;;
    *) echo "unknown model $m" >&2; exit 1 ;;
    esac
done
date -u +%T
