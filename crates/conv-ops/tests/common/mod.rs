//! Random geometries for the property tests.
#![allow(dead_code)]

use conv_ops::ConvGeometry;
use proptest::prelude::*;

/// Random valid geometries: 1-3 spatial dims, odd sizes, strides 1-3, padding 0-2 (asymmetric
/// allowed), dilation 1-2, groups (depthwise included), batch 1-5.
pub fn geometry(max_rank: usize) -> impl Strategy<Value = ConvGeometry> {
    (1..=max_rank)
        .prop_flat_map(|rank| {
            (
                1usize..=5,                                  // batch
                prop::sample::select(vec![1usize, 2, 3, 4]), // groups
                1usize..=3,                                  // channels per group in
                1usize..=3,                                  // channels per group out
                prop::collection::vec(
                    (
                        1usize..=4,
                        1usize..=3,
                        0usize..=2,
                        0usize..=2,
                        1usize..=2,
                        0usize..=9,
                    ),
                    rank,
                ),
            )
        })
        .prop_filter_map(
            "kernel larger than padded input",
            |(n, grp, cg, kg, dims)| {
                let rank = dims.len();
                // Keep 3-D cases small: the reference is a naive 9-deep loop.
                let cap = if rank == 3 { 5 } else { 11 };
                let kernel: Vec<_> = dims.iter().map(|d| d.0).collect();
                let stride: Vec<_> = dims.iter().map(|d| d.1).collect();
                let before: Vec<_> = dims.iter().map(|d| d.2).collect();
                let after: Vec<_> = dims.iter().map(|d| d.3).collect();
                let dilation: Vec<_> = dims.iter().map(|d| d.4).collect();
                let input: Vec<_> = dims.iter().map(|d| (d.0 + d.5).min(cap)).collect();
                ConvGeometry::new(n, cg * grp, kg * grp, &input, &kernel)
                    .and_then(|g| g.with_groups(grp))
                    .and_then(|g| g.with_stride(&stride))
                    .and_then(|g| g.with_dilation(&dilation))
                    .and_then(|g| g.with_padding_per_side(&before, &after))
                    .ok()
            },
        )
}
