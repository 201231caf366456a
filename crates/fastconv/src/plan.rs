//! [`WinogradPlan`]: the fast algorithm for one convolution geometry, all three training passes.
//!
//! A plan fixes the tile (m per spatial dimension; chosen by [`crate::cost::choose_tile`] unless
//! given), synthesizes the transforms, and caches the transformed kernels until the weights change
//! (a copy of the weights is kept and compared bit for bit, a memcmp that is cheap next to the
//! convolution).
//!
//! - forward: `y = conv(x, w)` by F(m, r) tiles (module `tiled`);
//! - backward-data: the same machinery on the flipped, channel-transposed kernel with padding
//!   `r − 1 − p` (negative padding crops);
//! - backward-filter: F(r, m′), the roles of kernel and output swapped: `dy` chunks are the
//!   "kernels", every tile produces all `r` taps, and the products are accumulated over tiles in
//!   the transformed domain before a single output transform (module `filter_grad`).
//!
//! Only stride 1, dilation 1 and one group are supported; anything else is refused with
//! [`FastconvError::Unsupported`] naming the argument, so `nn` falls back to `conv-ops`.

use std::cell::RefCell;

use conv_ops::ConvGeometry;

use crate::error::{FastconvError, Result};
use crate::filter_grad::FilterWorkspace;
use crate::ntransform::{KernelWork, TileTransforms};
use crate::packed::PackedKernels;
use crate::points::transform_for;
use crate::tiled::{Correlation, GemmPath, correlate};

/// Transformed kernels, packed for the GEMMs, and the weights they were computed from.
#[derive(Debug, Clone)]
struct KernelCache {
    w_bits: Vec<u32>,
    u: PackedKernels,
}

impl KernelCache {
    fn matches(&self, w: &[f32]) -> bool {
        self.w_bits.len() == w.len() && self.w_bits.iter().zip(w).all(|(b, v)| *b == v.to_bits())
    }
}

/// Default number of tiles per block when none is set: the block's buffers (gathered D, V, the
/// mode-product scratch: C values per point; M and the outputs: K) stay within about 4 MiB,
/// rounded down to a multiple of 16 (the n of the 16-wide GEMM micro-kernels, so no panel is
/// padded), and never fewer than 48 tiles. With packed kernel transforms and register-blocked
/// mode products, larger blocks win: measured single-threaded (CPU time, Zen 4 AVX2) on the
/// ResNet-50 3×3 layers and the paper's 4×4 layer, 48-96 tiles beat 16 by 10-25 % (forward and
/// backward-filter), 25 vs 32 lost 10 % to a half-empty 16-wide panel.
pub fn default_block_tiles(alpha_n: usize, in_channels: usize, out_channels: usize) -> usize {
    let per_tile_bytes = 4 * alpha_n * (3 * in_channels + 2 * out_channels);
    ((4 << 20) / per_tile_bytes.max(1) / 16 * 16).clamp(48, 1024)
}

thread_local! {
    /// The kernel transform's f64 buffers, shared by every plan that runs on this thread: they
    /// grow to the largest layer's size once and are reused by every weight update, instead of
    /// one set per plan (per-plan sets held 1.8 GB more for ResNet-34's 36 layers at 224²).
    static KERNEL_WORK: RefCell<KernelWork> = RefCell::new(KernelWork::default());
}

/// The Winograd algorithm for one geometry: tile choice, transforms, cached kernel transforms.
#[derive(Debug, Clone)]
pub struct WinogradPlan {
    geom: ConvGeometry,
    tile: Vec<usize>,
    filter_tile: Vec<usize>,
    fwd: TileTransforms,
    bwd_filter: TileTransforms,
    block_tiles: Option<usize>,
    gemm_path: GemmPath,
    cache_fwd: Option<KernelCache>,
    cache_bwd: Option<KernelCache>,
    filter_ws: FilterWorkspace,
}

/// Refuses what Winograd cannot do, naming the argument.
pub fn check_supported(geom: &ConvGeometry) -> Result<()> {
    if let Some(s) = geom.stride().iter().find(|&&s| s != 1) {
        return Err(FastconvError::Unsupported {
            arg: "stride",
            detail: format!("{s} (only stride 1; use conv-ops)"),
        });
    }
    if let Some(d) = geom.dilation().iter().find(|&&d| d != 1) {
        return Err(FastconvError::Unsupported {
            arg: "dilation",
            detail: format!("{d} (only dilation 1; use conv-ops)"),
        });
    }
    if geom.groups() != 1 {
        return Err(FastconvError::Unsupported {
            arg: "groups",
            detail: format!("{} (only 1 group; use conv-ops)", geom.groups()),
        });
    }
    if geom.batch() == 0 {
        return Err(FastconvError::Zero { arg: "batch" });
    }
    if geom.in_channels() == 0 {
        return Err(FastconvError::Zero { arg: "in_channels" });
    }
    if geom.out_channels() == 0 {
        return Err(FastconvError::Zero {
            arg: "out_channels",
        });
    }
    Ok(())
}

/// Broadcasts a per-dimension argument (one entry for all dimensions, or one per dimension).
fn per_dim(arg: &'static str, v: &[usize], rank: usize) -> Result<Vec<usize>> {
    let out = match v.len() {
        1 => vec![v[0]; rank],
        n if n == rank => v.to_vec(),
        n => {
            return Err(FastconvError::Rank {
                arg,
                got: n,
                expected: rank,
            });
        }
    };
    if out.contains(&0) {
        return Err(FastconvError::Zero { arg });
    }
    Ok(out)
}

impl WinogradPlan {
    /// A plan for `geom` with output tile `tile` (m per spatial dimension, or one value for all);
    /// `None` lets the cost model choose ([`crate::cost::choose_tile`]). The backward-filter pass
    /// uses F(r, m′) with m′ = the forward tile.
    ///
    /// Errors: stride, dilation or groups not 1 (`Unsupported`), a tile of wrong rank or zero, or
    /// an F(m, r) whose transform cannot be built.
    pub fn new(geom: &ConvGeometry, tile: Option<&[usize]>) -> Result<Self> {
        check_supported(geom)?;
        let rank = geom.rank();
        let tile = match tile {
            Some(t) => per_dim("tile", t, rank)?,
            None => crate::cost::choose_tile(geom, &crate::cost::CostModel::default())?,
        };
        Self::with_filter_tile(geom, &tile, &tile)
    }

    /// As [`WinogradPlan::new`] with an explicit tile for each pass: `tile` (m of F(m, r), forward
    /// and backward-data) and `filter_tile` (m′ of F(r, m′), backward-filter).
    pub fn with_filter_tile(
        geom: &ConvGeometry,
        tile: &[usize],
        filter_tile: &[usize],
    ) -> Result<Self> {
        check_supported(geom)?;
        let rank = geom.rank();
        let tile = per_dim("tile", tile, rank)?;
        let filter_tile = per_dim("filter_tile", filter_tile, rank)?;
        let kernel = geom.kernel();
        let fwd: Vec<_> = tile
            .iter()
            .zip(kernel)
            .map(|(&m, &r)| transform_for(m, r))
            .collect::<Result<_>>()?;
        let bf: Vec<_> = filter_tile
            .iter()
            .zip(kernel)
            .map(|(&mp, &r)| transform_for(r, mp))
            .collect::<Result<_>>()?;
        Ok(WinogradPlan {
            geom: *geom,
            tile,
            filter_tile,
            fwd: TileTransforms::new(&fwd)?,
            bwd_filter: TileTransforms::new(&bf)?,
            block_tiles: None,
            gemm_path: GemmPath::default(),
            cache_fwd: None,
            cache_bwd: None,
            filter_ws: FilterWorkspace::default(),
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> &ConvGeometry {
        &self.geom
    }

    /// Output tile m per spatial dimension (forward and backward-data).
    pub fn tile(&self) -> &[usize] {
        &self.tile
    }

    /// Tile m′ of F(r, m′) per spatial dimension (backward-filter).
    pub fn filter_tile(&self) -> &[usize] {
        &self.filter_tile
    }

    /// Overrides the number of tiles per block (cache blocking); `0` is refused.
    pub fn set_block_tiles(&mut self, tiles: usize) -> Result<()> {
        if tiles == 0 {
            return Err(FastconvError::Zero { arg: "tiles" });
        }
        self.block_tiles = Some(tiles);
        Ok(())
    }

    /// Chooses how forward and backward-data run their transformed-domain products (default
    /// [`GemmPath::Panels`]); both give the same results up to rounding.
    pub fn set_gemm_path(&mut self, path: GemmPath) {
        self.gemm_path = path;
    }

    /// Tiles per block: the explicit setting, or the default capped so that every thread of the
    /// current pool gets a block (`tiles` = tiles of the pass).
    fn block(&self, alpha_n: usize, c: usize, k: usize, tiles: usize) -> usize {
        self.block_tiles.unwrap_or_else(|| {
            let threads = rayon::current_num_threads().max(1);
            default_block_tiles(alpha_n, c, k).min(tiles.div_ceil(threads).max(1))
        })
    }

    /// Number of tiles of a pass with output tile `m` on output `out`, over the batch.
    fn tiles(&self, out: &[usize], m: &[usize]) -> usize {
        self.geom.batch()
            * out
                .iter()
                .zip(m)
                .map(|(o, m)| o.div_ceil(*m))
                .product::<usize>()
    }

    fn check(&self, arg: &'static str, got: usize, expected: usize) -> Result<()> {
        if got != expected {
            return Err(FastconvError::BufferLength { arg, got, expected });
        }
        Ok(())
    }

    /// Kernel transform of the `inner × outer` kernels laid out (taps, inner, outer), packed as
    /// α^N matrices `U_ξᵀ` (outer × inner) in core-blas's micro-panels and cached under `w`'s bits.
    /// The buffers of the previous transform are reused (the thread's [`KERNEL_WORK`] and the
    /// cache's own), so a weight update allocates nothing once they have grown.
    fn transformed(
        cache: &mut Option<KernelCache>,
        tt: &TileTransforms,
        w: &[f32],
        dims: (usize, usize),
        layout: impl FnOnce(&mut [f32]),
    ) -> Result<()> {
        if cache.as_ref().is_some_and(|c| c.matches(w)) {
            return Ok(());
        }
        KERNEL_WORK.with(|cell| match cell.try_borrow_mut() {
            Ok(mut work) => Self::transform_into(cache, &mut work, tt, w, dims, layout),
            // Not reached (no transform runs inside another); a private set is still correct.
            Err(_) => Self::transform_into(cache, &mut KernelWork::default(), tt, w, dims, layout),
        })
    }

    /// [`WinogradPlan::transformed`] with the transform's buffers `work`.
    fn transform_into(
        cache: &mut Option<KernelCache>,
        work: &mut KernelWork,
        tt: &TileTransforms,
        w: &[f32],
        (inner, outer): (usize, usize),
        layout: impl FnOnce(&mut [f32]),
    ) -> Result<()> {
        let taps: usize = tt.kernel().iter().product();
        work.g.resize(taps * inner * outer, 0.0);
        layout(&mut work.g);
        let g = std::mem::take(&mut work.g);
        let done = tt.kernel_transform_f64(&g, inner * outer, work);
        work.g = g;
        done?;
        let a_n: usize = tt.in_tile().iter().product();
        let (mr, _) = core_blas::Gemm::global()?.tile();
        // The previous cache (if any) gives its storage to the new one.
        let mut c = cache.take().unwrap_or_else(|| KernelCache {
            w_bits: Vec::new(),
            u: PackedKernels::new(&[], 0, 0, 0, mr),
        });
        c.u.repack(&work.out, a_n, outer, inner, mr);
        c.w_bits.clear();
        c.w_bits.extend(w.iter().map(|v| v.to_bits()));
        *cache = Some(c);
        Ok(())
    }

    /// Forward pass `y = conv(x, w)` (no bias): x N×C×spatial, w K×C×kernel, y N×K×output.
    pub fn forward(&mut self, x: &[f32], w: &[f32], y: &mut [f32]) -> Result<()> {
        let g = self.geom;
        self.check("x", x.len(), g.x_len())?;
        self.check("w", w.len(), g.w_len())?;
        self.check("y", y.len(), g.y_len())?;
        let (c, k, taps) = (g.in_channels(), g.out_channels(), g.kernel_len());
        // U[ξ][c][k] from g[tap][c·K + k] = w[k][c][tap].
        Self::transformed(&mut self.cache_fwd, &self.fwd, w, (c, k), |gl| {
            for ki in 0..k {
                for ci in 0..c {
                    for t in 0..taps {
                        gl[t * c * k + ci * k + ki] = w[(ki * c + ci) * taps + t];
                    }
                }
            }
        })?;
        let job = Correlation {
            batch: g.batch(),
            in_channels: c,
            out_channels: k,
            input: g.input().to_vec(),
            output: g.output().to_vec(),
            pad_before: g.pad_before().iter().map(|&p| p as isize).collect(),
        };
        let alpha_n: usize = self.fwd.in_tile().iter().product();
        let block = self.block(alpha_n, c, k, self.tiles(g.output(), &self.tile));
        let u = &self
            .cache_fwd
            .as_ref()
            .map(|c| &c.u)
            .ok_or(FastconvError::Zero { arg: "w" })?;
        correlate(&job, &self.fwd, u, x, y, block, self.gemm_path)
    }

    /// Backward-data pass `dx = ∂⟨y, dy⟩/∂x`: dy N×K×output, w K×C×kernel, dx N×C×input.
    /// Computed as a forward correlation of `dy` with the flipped, transposed kernel and padding
    /// `r − 1 − pad_before` per dimension.
    pub fn backward_data(&mut self, dy: &[f32], w: &[f32], dx: &mut [f32]) -> Result<()> {
        let g = self.geom;
        self.check("dy", dy.len(), g.y_len())?;
        self.check("w", w.len(), g.w_len())?;
        self.check("dx", dx.len(), g.x_len())?;
        let (c, k, taps) = (g.in_channels(), g.out_channels(), g.kernel_len());
        // U[ξ][k][c] from g[s][k·C + c] = w[k][c][flip(s)], flip reverses every spatial index,
        // which on the row-major flat tap index is taps − 1 − s.
        Self::transformed(&mut self.cache_bwd, &self.fwd, w, (k, c), |gl| {
            for ki in 0..k {
                for ci in 0..c {
                    for s in 0..taps {
                        gl[s * c * k + ki * c + ci] = w[(ki * c + ci) * taps + (taps - 1 - s)];
                    }
                }
            }
        })?;
        let job = Correlation {
            batch: g.batch(),
            in_channels: k,
            out_channels: c,
            input: g.output().to_vec(),
            output: g.input().to_vec(),
            pad_before: g
                .kernel()
                .iter()
                .zip(g.pad_before())
                .map(|(&r, &p)| r as isize - 1 - p as isize)
                .collect(),
        };
        let alpha_n: usize = self.fwd.in_tile().iter().product();
        let block = self.block(alpha_n, k, c, self.tiles(g.input(), &self.tile));
        let u = &self
            .cache_bwd
            .as_ref()
            .map(|c| &c.u)
            .ok_or(FastconvError::Zero { arg: "w" })?;
        correlate(&job, &self.fwd, u, dy, dx, block, self.gemm_path)
    }

    /// Backward-filter pass `dw = ∂⟨y, dy⟩/∂w`: x N×C×input, dy N×K×output, dw K×C×kernel
    /// (overwritten), by F(r, m′) accumulated over tiles.
    pub fn backward_filter(&mut self, x: &[f32], dy: &[f32], dw: &mut [f32]) -> Result<()> {
        let g = self.geom;
        self.check("x", x.len(), g.x_len())?;
        self.check("dy", dy.len(), g.y_len())?;
        self.check("dw", dw.len(), g.w_len())?;
        let alpha_n: usize = self.bwd_filter.in_tile().iter().product();
        let tiles = self.tiles(g.output(), &self.filter_tile);
        let block = self.block(alpha_n, g.in_channels(), g.out_channels(), tiles);
        crate::filter_grad::backward_filter(
            &g,
            &self.bwd_filter,
            x,
            dy,
            dw,
            block,
            &mut self.filter_ws,
        )
    }
}
