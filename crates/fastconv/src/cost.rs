//! Tile choice by a cost model: multiplies, transform work, memory traffic, vector width and an
//! accuracy budget. Overridable: pass a tile to [`crate::WinogradPlan::new`] or tune
//! [`CostModel`].
//!
//! For a forward pass with T = N·Π⌈out_d / m_d⌉ tiles of α^N points each:
//! - transformed-domain GEMMs: `2·α^N·C·K′·T` flops, `K′` = K rounded up to the vector width
//!   (the GEMM's vectorized dimension);
//! - transforms, counted on the nonzeros of the sparse matrices as applied mode by mode:
//!   input `2·C·T·Σ_n nnz(Bₙᵀ)·Π_{d≠n} α_d`, output `2·K·T·Σ_n nnz(Aₙᵀ)·Π_{d<n} m_d·Π_{d>n} α_d`,
//!   weighted by `transform_weight` (they stream memory and run below GEMM speed);
//! - memory traffic of V and M (written once, read once) and the tile gather,
//!   `4·T·α^N·(3C + 2K)` bytes, weighted by `byte_weight` (flop-equivalents per byte);
//! - accuracy: an F(m_d, r_d) is admissible only if its tabulated 2-D error
//!   ([`crate::points::TABLE`]) is at most `max_error`; m = 1 (F(1, r): a plain dot product per
//!   output, exact up to rounding) is always admissible, and for 1-wide kernels (r = 1) it is the
//!   only choice, since F(m, 1) only re-expresses a pointwise product.

use std::collections::HashMap;

use conv_ops::ConvGeometry;

use crate::error::{FastconvError, Result};
use crate::points::{tabulated, transform_for};

/// Weights of the tile cost model; costs are in GEMM-flop equivalents.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Cost of one transform flop relative to a GEMM flop.
    pub transform_weight: f64,
    /// Cost of one byte of memory traffic in GEMM flops.
    pub byte_weight: f64,
    /// f32 lanes of the GEMM's vector registers (16 for AVX-512).
    pub vector_width: usize,
    /// Largest admissible tabulated 2-D error of any F(m_d, r_d).
    pub max_error: f64,
    /// Largest m considered per dimension.
    pub max_m: usize,
}

impl Default for CostModel {
    /// Transforms at a quarter of GEMM speed, 2 flops per byte of traffic (a GEMM-bound core
    /// sustains ~30 flop/cycle against ~15 bytes/cycle of L2 bandwidth), AVX-512 width, and the
    /// accuracy budget 2e-5 (admits F(6, 3), tabulated 2-D error 1.1e-5, and keeps α ≤ 8).
    fn default() -> Self {
        CostModel {
            transform_weight: 4.0,
            byte_weight: 2.0,
            vector_width: 16,
            max_error: 2e-5,
            max_m: 8,
        }
    }
}

/// Per-(m, r) data the model needs: α, nnz(Aᵀ), nnz(Bᵀ).
#[derive(Debug, Clone, Copy)]
struct OneDim {
    m: usize,
    alpha: usize,
    nnz_at: usize,
    nnz_bt: usize,
}

/// Estimated forward cost of tile `m` (one per dimension) for `geom` under `model`.
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
    let t = transform_for(m, r)?;
    let nnz = |q: &crate::DenseMatrix<num_rational::BigRational>| q.data.len() - q.zeros();
    Ok(OneDim {
        m,
        alpha: t.alpha(),
        nnz_at: nnz(t.at()),
        nnz_bt: nnz(t.bt()),
    })
}

fn cost_of(geom: &ConvGeometry, dims: &[OneDim], model: &CostModel) -> f64 {
    let (c, k) = (geom.in_channels() as f64, geom.out_channels() as f64);
    let w = model.vector_width.max(1);
    let k_padded = geom.out_channels().div_ceil(w) as f64 * w as f64;
    let tiles: f64 = geom.batch() as f64
        * geom
            .output()
            .iter()
            .zip(dims)
            .map(|(o, d)| o.div_ceil(d.m) as f64)
            .product::<f64>();
    let a_n: f64 = dims.iter().map(|d| d.alpha as f64).product();
    let gemm = 2.0 * a_n * c * k_padded * tiles;
    let mut in_tr = 0.0;
    let mut out_tr = 0.0;
    for n in 0..dims.len() {
        let others: f64 = dims
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != n)
            .map(|(_, d)| d.alpha as f64)
            .product();
        in_tr += dims[n].nnz_bt as f64 * others;
        let before: f64 = dims[..n].iter().map(|d| d.m as f64).product();
        let after: f64 = dims[n + 1..].iter().map(|d| d.alpha as f64).product();
        out_tr += dims[n].nnz_at as f64 * before * after;
    }
    let transforms = 2.0 * tiles * (c * in_tr + k * out_tr);
    let bytes = 4.0 * tiles * a_n * (3.0 * c + 2.0 * k);
    gemm + model.transform_weight * transforms + model.byte_weight * bytes
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
                    let od = one_dim(m, r)?;
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
