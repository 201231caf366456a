#!/bin/bash
# lean_table.sh OUTPREFIX PROBEBIN ITERS [layer...] (run under `quiet`; PROBEBIN = a release build of
# conv-ops's probe_passes example; then `python3 lean_table.py OUTPREFIX [OUTPREFIX...]`): the lean table's fair protocol (session 29).
# Per layer, A B B A: oneDNN (conv_layers.py, both layouts, --min-time 0 --min-iters ITERS: 2 warm-up
# calls then exactly ITERS timed calls per pass, wall clock), probe_passes --back-to-back (the lean
# algorithms: 2 warm-up calls then ITERS timed calls per pass, wall clock), the probe again, oneDNN again.
# Both sides print the min and the median of each run's ITERS calls.
out=$1; P=$2; N=$3; shift 3
declare -A A=( [r50_3x3_c64_56]="8 64 64 56x56 3x3 1 1" [r50_3x3_c128_28]="8 128 128 28x28 3x3 1 1"
 [r50_3x3_c256_14]="8 256 256 14x14 3x3 1 1" [r50_3x3_c512_7]="8 512 512 7x7 3x3 1 1"
 [r50_3x3s2_c128_56]="8 128 128 56x56 3x3 2 1" [r50_1x1_256to64_56]="8 256 64 56x56 1x1 1 0"
 [vgg_conv1_2_64]="1 64 64 224x224 3x3 1 1" [c3d_64_8x56x56_b1]="1 64 64 8x56x56 3x3x3 1 1" )
F="fwd/convgemm,fwd/direct,bwd-data/deconvgemm,bwd-data/flipped-convgemm,bwd-data/flipped-direct,bwd-filter/convgemm-trans,bwd-filter/direct"
[ $# -eq 0 ] && set -- r50_3x3_c64_56 r50_3x3_c128_28 r50_3x3_c256_14 r50_3x3_c512_7 r50_3x3s2_c128_56 r50_1x1_256to64_56 vgg_conv1_2_64 c3d_64_8x56x56_b1
date -u +"start %T" > $out.onednn
: > $out.probe
one() { echo "## $1 $(date -u +%T)" >> $out.onednn; /tmp/anchor-venv/bin/python /work/shared/anchors/conv/conv_layers.py --threads 1 --no-wait --variants nchw,nhwc --min-time 0 --min-iters $N --layers $1 >> $out.onednn 2>&1; }
pr() { echo "## $1 $(date -u +%T)" >> $out.probe; $P --back-to-back ${A[$1]} $N $F >> $out.probe 2>&1; }
for l in "$@"; do
  one $l; pr $l; pr $l; one $l
done
date -u +"end %T" >> $out.onednn
date -u +"end %T" >> $out.probe
