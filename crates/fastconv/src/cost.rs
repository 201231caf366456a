//! Tile choice by a cost model: multiplies, transform work, memory traffic, vector width and an
//! accuracy budget. Overridable: pass a tile to [`crate::WinogradPlan::new`] or tune
//! [`CostModel`].
//!
//! With T = N·Π⌈out_d / m_d⌉ tiles of α^N points each, per pass:
//! - transformed-domain GEMMs: `2·α^N·C·K·T′` flops, `T′` = T rounded up to the vector width
//!   (the tiles are the GEMM's n, packed in `NR`-wide micro-panels: 8 tiles cost as much as 16);
//! - transforms, counted on the operations of the sparse matrices as applied mode by mode
//!   (nonzeros, ± row pairs counted once: [`crate::SparseTransform::applied_ops`]):
//!   input `2·C·T·Σ_n ops(Bₙᵀ)·Π_{d≠n} α_d` (with the phased gathers, the modes before the last
//!   see m instead of α along the last dimension, plus `copy_weight` per shifted copy of its rows
//!   w ≥ m), output `2·K·T·Σ_n ops(Aₙᵀ)·…` in the executed order (the last mode first, on α of
//!   the others, then modes 0, 1, …; Aᵀ counted in core-blas's column-paired form,
//!   [`crate::SparseTransform::executed_ops`]), weighted by `transform_weight` (they stream
//!   memory and run below GEMM speed);
//! - the phased gathers' phantom tiles (⌈α/m⌉ − 1 after each run of tiles along the last
//!   dimension and at each block boundary), gathered and transformed like tiles by every mode
//!   but the last;
//! - memory traffic of V and M (written once, read once) and the tile gather,
//!   `4·T·α^N·(3C + 2K)` bytes per pass, plus per block the backward-filter accumulator and the
//!   copy of the packed U, weighted by `byte_weight` (flop-equivalents per byte);
//! - all three training passes: forward (C → K), backward-data (K → C) and backward-filter
//!   (F(r, m): Bᵀ on x, G on the chunks of dy; a tile whose F(r, m) is unavailable is refused);
//! - accuracy: an F(m_d, r_d) is admissible only if its tabulated 2-D error
//!   ([`crate::points::TABLE`]) is at most `max_error`; m = 1 (F(1, r): a plain dot product per
//!   output, exact up to rounding) is always admissible, and for 1-wide kernels (r = 1) it is the
//!   only choice, since F(m, 1) only re-expresses a pointwise product.

use std::collections::HashMap;

use conv_ops::ConvGeometry;

use crate::error::{FastconvError, Result};
use crate::points::{forms_for, tabulated};

/// Weights of the tile cost model; costs are in GEMM-flop equivalents.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Cost of one transform flop relative to a GEMM flop.
    pub transform_weight: f64,
    /// Cost of one byte of memory traffic in GEMM flops.
    pub byte_weight: f64,
    /// Width of the GEMM's micro-panels along the tiles (its `NR`): the tile count is rounded up
    /// to it.
    pub vector_width: usize,
    /// Largest admissible tabulated 2-D error of any F(m_d, r_d).
    pub max_error: f64,
    /// Largest m considered per dimension.
    pub max_m: usize,
    /// Cost of one source value read by the tile gathers (forward's x, backward-data's dy,
    /// backward-filter's x) in GEMM flops, on top of `byte_weight`'s block traffic: the gather's
    /// scalar loads wait on the source lines from L3.
    pub gather_weight: f64,
    /// Cost of one value copied by the phased gathers (the rows w ≥ m of the last dimension,
    /// shifted copies of rows w mod m) in transform flops (so times `transform_weight`).
    pub copy_weight: f64,
}

impl Default for CostModel {
    /// Weights fitted to single-thread measurements on Zen 4 (AVX2), after the ± row pairing:
    /// a transform flop costs 20 GEMM flops (the transforms run at SSE2 width, without FMA,
    /// streaming their blocks, while the GEMM runs at ~70 GFLOP/s), 2 flops per byte of block
    /// traffic, panels of 16 tiles, and the accuracy budget 3e-5, which admits the α = 9 sets
    /// F(6, 4) (tabulated 2-D error 2.8e-5), F(7, 3), F(4, 6), F(3, 7), F(5, 5). With these the
    /// model picks the measured best of the tiles tried on the paper's 4×4 layer (6×6, 16 %
    /// faster than 5×5), the ResNet-50 3×3 layers (4×4, 4×4, 7×7, 4×4) and C3D (4×4×4).
    /// A gathered source value costs 80 GEMM flops (Cascade Lake, session 16: `gather_apply`
    /// takes 24 % of the paper benchmark's batch-1 training step, ~1 ns per read). Without that
    /// term the paper's second layer (221² → 218²) took 3×6 (model 0.9 % below 6×6), measured
    /// 13-17 % slower than 6×6 in all three passes; every weight from 40 to 150 picks 6×6 there
    /// and leaves the other choices above unchanged. Raised to 200 in session 17: C3D (64→64,
    /// 8×56², batch 1) then takes 4×7×7 instead of 4×4×4, measured 2-14 % (median 11 %) faster over its three
    /// passes in each of six processes (`wino_probe blocks c3d`, CPU time, medians); every 2-D
    /// layer of the probes (paper, ResNet-20/-50, VGG-16) keeps its tile up to 250.
    /// Lowered to 150 in session 18, on the Zen 4 with AVX-512 the issue targets: there C3D
    /// runs faster on 4×4×4 (its backward-filter 1-2 ms of ~21 ms faster, forward and
    /// backward-data level: the three passes' minima 2-3 % lower in each of six processes),
    /// while C3D's 64→128 layer (`c3d_128`, batch 2) stays 6-7 % faster on 4×7×7 (four
    /// processes); 140-170 picks both, and every 2-D probe layer's tile is unchanged.
    /// Session 22 (Zen 4, AVX-512): the transform counts follow the executed order (Aᵀ's last
    /// mode first; the phased gathers' modes before the last on m phases, plus their shifted
    /// copies at `copy_weight` 8) and `byte_weight` 2 → 4, fitted to 41 tiles measured on seven
    /// layers (`wino_probe blocks`, CPU ms, alternating in one process): the model had the
    /// per-dimension tiles' asymmetry backwards (7×4 is 6-12 % faster than 4×4 on ResNet-50's
    /// 3×3 layers, 4×7 slower). It now picks 7×4 on 128@28², 7×5 on 256@14², 7×2 on 512@7²
    /// and 4×7×4 on C3D, keeps 6×6 on the paper's layers and 4×4 on 64@56² (7×4 measured 11 %
    /// faster there, not found); every weight in TW 15-25, GW 100-200, BW 3-5 picks the same.
    /// Session 23: the model missed 7×4 on 64@56² because it counted neither the phantom tiles
    /// of the phased gathers (one more tile per run along the last dimension: +14 % gathered
    /// tiles on 28² planes with m = 4 or 7, +25 % with 7×7, +7 % on 56² planes) nor Aᵀ as
    /// the column-paired kernel runs it (F(6,4): 25 multiply-adds per column, not 49). With
    /// both and `gather_weight` 150 → 800 it picks the measured best of every layer of the
    /// session-22 grid (41 tiles on seven layers, zero regret; any GW 400-1500 at TW 20, or TW
    /// 15-30 at GW 500, does the same): 7×4 on 64@56² as well, and on the probes' other
    /// layers 4×2 on ResNet-20's 64@8², 7×4 on VGG-16's 3→64 and 64@224², 7×7 on its
    /// 128@112², 4×7×2 on the C3D-like 256→512 layer.
    fn default() -> Self {
        CostModel {
            transform_weight: 20.0,
            byte_weight: 4.0,
            vector_width: 16,
            max_error: 3e-5,
            max_m: 8,
            gather_weight: 800.0,
            copy_weight: 8.0,
        }
    }
}

/// Per-(m, r) data the model needs: α and the operations of Aᵀ, Bᵀ (and of F(r, m)'s Bᵀ, G).
#[derive(Debug, Clone, Copy)]
struct OneDim {
    m: usize,
    alpha: usize,
    nnz_at: usize,
    nnz_bt: usize,
    /// Operations of Bᵀ and G of F(r, m) (backward-filter, same α).
    filter_bt: usize,
    filter_g: usize,
}

/// Estimated cost of one training step's three passes (forward, backward-data, backward-filter)
/// with tile `m` (one per dimension) for `geom` under `model`. Errors: `m` of the wrong rank, or
/// F(m, r) or the backward-filter's F(r, m) not available for some dimension.
pub fn tile_cost(geom: &ConvGeometry, m: &[usize], model: &CostModel) -> Result<f64> {
    if m.len() != geom.rank() {
        return Err(FastconvError::Rank {
            arg: "m",
            got: m.len(),
            expected: geom.rank(),
        });
    }
    let dims: Vec<OneDim> = m
        .iter()
        .zip(geom.kernel())
        .map(|(&m, &r)| one_dim(m, r))
        .collect::<Result<_>>()?;
    Ok(cost_of(geom, &dims, model))
}

fn one_dim(m: usize, r: usize) -> Result<OneDim> {
    let tf = forms_for(m, r)?;
    // The plan's backward-filter runs F(r, m) with the same m: a tile without it is not usable.
    let ff = forms_for(r, m)?;
    // Operations per column with ± row pairs merged (`applied_ops`), Aᵀ in the column-paired
    // form where core-blas's `SmallA` runs it (`executed_ops`); the weights are fitted to
    // measurements with these counts and reproduce the measured best tiles.
    Ok(OneDim {
        m,
        alpha: m + r - 1,
        nnz_at: tf.at.executed_ops(),
        nnz_bt: tf.bt.applied_ops(),
        filter_bt: ff.bt.applied_ops(),
        filter_g: ff.g32.applied_ops(),
    })
}

fn cost_of(geom: &ConvGeometry, dims: &[OneDim], model: &CostModel) -> f64 {
    let (c, k) = (geom.in_channels() as f64, geom.out_channels() as f64);
    let w = model.vector_width.max(1) as f64;
    let tiles: f64 = geom.batch() as f64
        * geom
            .output()
            .iter()
            .zip(dims)
            .map(|(o, d)| o.div_ceil(d.m) as f64)
            .product::<f64>();
    let a_n: f64 = dims.iter().map(|d| d.alpha as f64).product();
    let gemm = 2.0 * a_n * c * k * ((tiles / w).ceil() * w);
    let (mut in_tr, mut out_tr, mut f_in, mut f_dy) = (0.0, 0.0, 0.0, 0.0);
    let last = dims.len() - 1;
    // The phased gathers (`tiled::Phased`: 2 or more dimensions and α > m along the last) run
    // the modes before the last on the m phases of the last dimension only (its other α − m
    // rows are shifted copies): those modes' Bᵀ see m instead of α along the last dimension.
    let phased = last > 0 && dims[last].alpha > dims[last].m;
    for n in 0..dims.len() {
        let mut others: f64 = dims
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != n)
            .map(|(_, d)| d.alpha as f64)
            .product();
        if phased && n < last {
            others = others / dims[last].alpha as f64 * dims[last].m as f64;
        }
        in_tr += dims[n].nnz_bt as f64 * others;
        f_in += dims[n].filter_bt as f64 * others;
        if phased && n == last {
            // The phased rows w ≥ m: copies of rows w mod m shifted by w / m tiles.
            let copies = (dims[last].alpha - dims[last].m) as f64 * others * model.copy_weight;
            in_tr += copies;
            f_in += copies;
        }
        // Aᵀ in the executed order (`transform_from_rows`): the last mode first (on α of every
        // other mode), then modes 0, 1, … (m of the last mode and of the modes already done).
        let (before, after): (f64, f64) = if n == last {
            (1.0, dims[..last].iter().map(|d| d.alpha as f64).product())
        } else {
            (
                dims[..n]
                    .iter()
                    .chain(&dims[last..])
                    .map(|d| d.m as f64)
                    .product(),
                dims[n + 1..last].iter().map(|d| d.alpha as f64).product(),
            )
        };
        out_tr += dims[n].nnz_at as f64 * before * after;
        // G of F(r, m) on the m-sized chunks of dy, modes in order.
        let done: f64 = dims[..n].iter().map(|d| d.alpha as f64).product();
        let rest: f64 = dims[n + 1..].iter().map(|d| d.m as f64).product();
        f_dy += dims[n].filter_g as f64 * done * rest;
    }
    // Forward (C → K), backward-data (K → C) and backward-filter (Bᵀ on x, G on dy; the GEMMs
    // have the same flops, the tiles as their k, so no panel padding).
    let transforms = 2.0 * tiles * ((c + k) * (in_tr + out_tr) + c * f_in + k * f_dy);
    let gemm = 2.0 * gemm + 2.0 * a_n * c * k * tiles;
    let block = crate::plan::default_block_tiles(a_n as usize, c as usize, k as usize) as f64;
    // Backward-filter's accumulator (α^N·K·C, tens of MiB on wide layers: DRAM) is read and
    // written by every block's GEMMs, and forward and backward-data copy the packed U_ξ (K·C per
    // ξ) into the GEMM's A buffer per block; counted as 64 bytes per α^N·K·C per block, i.e.
    // DRAM traffic at 4× the weight of the cache-resident block buffers.
    let acc_bytes = 64.0 * a_n * c * k * (tiles / block).ceil();
    let bytes = 3.0 * 4.0 * tiles * a_n * (3.0 * c + 2.0 * k) + acc_bytes;
    // The gathers' source reads: per tile and channel α^(N−1)·m with phases along the last
    // dimension (`tiled::Phased`: 2 or more dimensions and α > m there), else α^N.
    let per_tile = if phased {
        a_n / dims[last].alpha as f64 * dims[last].m as f64
    } else {
        a_n
    };
    // The phased gathers' phantom tiles: `extra` = ⌈α/m⌉ − 1 after every run of neighbours
    // along the last dimension (one per row of tiles, plus one per block boundary), gathered and
    // taken through every mode but the last like a tile.
    let phantoms = if phased {
        let runs: f64 = geom.batch() as f64
            * geom.output()[..last]
                .iter()
                .zip(dims)
                .map(|(o, d)| o.div_ceil(d.m) as f64)
                .product::<f64>()
            + (tiles / block).ceil();
        runs * (dims[last].alpha.div_ceil(dims[last].m) - 1) as f64
    } else {
        0.0
    };
    let mut before_last = 0.0;
    if phantoms > 0.0 {
        for n in 0..last {
            let others: f64 = dims
                .iter()
                .enumerate()
                .filter(|&(d, _)| d != n && d != last)
                .map(|(_, d)| d.alpha as f64)
                .product::<f64>()
                * dims[last].m as f64;
            before_last += dims[n].nnz_bt as f64 * others;
        }
    }
    let transforms = transforms + 2.0 * phantoms * ((c + k) * before_last);
    let reads = (tiles + phantoms) * per_tile * (2.0 * c + k);
    gemm + model.transform_weight * transforms
        + model.byte_weight * bytes
        + model.gather_weight * reads
}

/// Whether F(m, r) is admissible under the model's accuracy budget.
fn admissible(m: usize, r: usize, model: &CostModel) -> bool {
    if m == 1 {
        return true;
    }
    if r == 1 {
        // F(m, 1) only re-expresses a pointwise product: never worth it.
        return false;
    }
    tabulated(m, r).is_ok_and(|e| e.err_2d <= model.max_error)
}

/// The tile (m per spatial dimension) of least [`tile_cost`] among the admissible F(m_d, r_d),
/// m_d ≤ `model.max_m` and m_d ≤ the output size. Errors: unsupported geometry.
pub fn choose_tile(geom: &ConvGeometry, model: &CostModel) -> Result<Vec<usize>> {
    crate::plan::check_supported(geom)?;
    let rank = geom.rank();
    let mut options: Vec<Vec<OneDim>> = Vec::with_capacity(rank);
    let mut memo: HashMap<(usize, usize), OneDim> = HashMap::new();
    for d in 0..rank {
        let r = geom.kernel()[d];
        let out = geom.output()[d];
        let mut opts = Vec::new();
        for m in 1..=model.max_m.max(1).min(out.max(1)) {
            if !admissible(m, r, model) {
                continue;
            }
            let od = match memo.get(&(m, r)) {
                Some(od) => *od,
                None => {
                    // F(m, r) or the backward-filter's F(r, m) unavailable: not a candidate.
                    let Ok(od) = one_dim(m, r) else {
                        continue;
                    };
                    memo.insert((m, r), od);
                    od
                }
            };
            opts.push(od);
        }
        if opts.is_empty() {
            opts.push(one_dim(1, r)?);
        }
        options.push(opts);
    }
    // Exhaustive over the (small) product of per-dimension options.
    let mut best: Option<(f64, Vec<usize>)> = None;
    let mut idx = vec![0usize; rank];
    loop {
        let dims: Vec<OneDim> = (0..rank).map(|d| options[d][idx[d]]).collect();
        let cost = cost_of(geom, &dims, model);
        if best.as_ref().is_none_or(|(c, _)| cost < *c) {
            best = Some((cost, dims.iter().map(|d| d.m).collect()));
        }
        let mut d = 0;
        loop {
            if d == rank {
                let (_, tile) = best.unwrap_or((0.0, vec![1; rank]));
                return Ok(tile);
            }
            idx[d] += 1;
            if idx[d] < options[d].len() {
                break;
            }
            idx[d] = 0;
            d += 1;
        }
    }
}
