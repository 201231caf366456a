//! [`WinogradPlan`]: the fast algorithm for one convolution geometry, all three training passes.
//!
//! A plan fixes the tile (m per spatial dimension; chosen by [`crate::cost::choose_tile`] unless
//! given), synthesizes the transforms, and caches the transformed kernels until the weights change
//! (a copy of the weights is kept and compared bit for bit, a memcmp that is cheap next to the
//! convolution). For training, where the weights change every step, [`WinogradPlan::set_keep_kernels`]
//! `(false)` keeps nothing per plan: the kernels are transformed into a buffer of the calling
//! thread shared by every plan.
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
use crate::ntransform::TileTransforms;
use crate::packed::{KernelSource, PackedKernels};
use crate::points::forms_for;
use crate::tiled::{Correlation, GemmPath, correlate};

/// Transformed kernels, packed for the GEMMs, and the weights they were computed from.
#[derive(Debug, Clone)]
struct KernelCache {
    w_bits: Vec<u32>,
    u: PackedKernels,
}

impl KernelCache {
    /// Whether `w` has the bits the cache was computed from: chunks of 64 values, each folded
    /// without a branch per value (so the compiler vectorises it), an exit per chunk. (A
    /// short-circuit per value ran one scalar compare per weight: 15 % of the 512@7² forward,
    /// perf 00:52 UTC session 14.)
    fn matches(&self, w: &[f32]) -> bool {
        self.w_bits.len() == w.len()
            && self
                .w_bits
                .chunks(64)
                .zip(w.chunks(64))
                .all(|(b, v)| b.iter().zip(v).fold(0, |d, (b, v)| d | (b ^ v.to_bits())) == 0)
    }
}

/// Default number of tiles per block when none is set: the block's buffers (gathered D, V, the
/// mode-product scratch: C values per point; M and the outputs: K) stay within about 4 MiB,
/// rounded down to a multiple of 16, never fewer than 48 tiles, then rounded up to a whole
/// number of the GEMM's `NR`-wide micro-panels (the tiles are the products' n: 16 on AVX2, 32
/// on AVX-512, where 48 or 80 tiles would leave a panel a half or a sixth empty). With packed
/// kernel transforms and register-blocked mode products, larger blocks win: measured
/// single-threaded (CPU time, Zen 4 AVX2) on the ResNet-50 3×3 layers and the paper's 4×4 layer,
/// 48-96 tiles beat 16 by 10-25 % (forward and backward-data), 25 vs 32 lost 10 % to a
/// half-empty 16-wide panel; on the AVX-512 Xeon (session 11) 64 instead of 48 tiles ran
/// ResNet-50's 128@28² forward 0.84× and 96 instead of 80 the paper layer's 0.90×.
pub fn default_block_tiles(alpha_n: usize, in_channels: usize, out_channels: usize) -> usize {
    let nr = core_blas::Gemm::global().map_or(16, |g| g.tile().1).max(1);
    block_tiles_within(4 << 20, alpha_n, in_channels, out_channels).next_multiple_of(nr)
}

/// Default number of tiles per block of backward-filter: as [`default_block_tiles`] (without the
/// rounding to whole micro-panels: here the tiles are the products' k), but within
/// about 8 MiB when the tile has at most 100 points (1-D and 2-D tiles): every block adds its
/// products into the K × C × α^N accumulator, and longer blocks (the products' inner dimension)
/// read and write it less often. Measured single-threaded against the 4 MiB blocks (thread CPU
/// time, min / median of 4-8 interleaved rounds, 09:17-09:20 UTC session 9): the paper's 4×4
/// layer (80 → 160 tiles) 0.976× / 0.985×, 64@56² (80 → 176) 0.968× / 0.964×, 128@28²
/// (48 → 80) 0.955× / 0.962×; 256@14² and 512@7² stay at 48 tiles (flat at 96); C3D (216
/// points) was 5 % slower at 96 tiles than at 48, so 3-D tiles keep the 4 MiB.
pub fn default_filter_block_tiles(
    alpha_n: usize,
    in_channels: usize,
    out_channels: usize,
) -> usize {
    let budget = if alpha_n <= 100 { 8 << 20 } else { 4 << 20 };
    block_tiles_within(budget, alpha_n, in_channels, out_channels)
}

/// Tiles per block whose buffers fit `budget` bytes (see [`default_block_tiles`]).
fn block_tiles_within(
    budget: usize,
    alpha_n: usize,
    in_channels: usize,
    out_channels: usize,
) -> usize {
    let per_tile_bytes = 4 * alpha_n * (3 * in_channels + 2 * out_channels);
    (budget / per_tile_bytes.max(1) / 16 * 16).clamp(48, 1024)
}

thread_local! {
    /// The packed transformed kernels of the plans that do not keep theirs
    /// ([`WinogradPlan::set_keep_kernels`]`(false)`): one buffer per thread, shared by every such
    /// plan, grown to the largest layer once.
    static SHARED_U: RefCell<PackedKernels> = RefCell::new(PackedKernels::empty());

    /// Backward-filter's accumulators and block buffers, shared by every plan on this thread:
    /// they are needed only during a call (a plan holding its own set kept one per layer).
    static FILTER_WORK: RefCell<FilterWorkspace> = RefCell::new(FilterWorkspace::default());
}

/// Bytes held by fastconv's per-thread workspaces on the calling thread and on every thread
/// of the current rayon pool (the pool of [`rayon::ThreadPool::install`] when called inside
/// one, else the global pool): the kernel transform's buffers, the shared transformed kernels
/// of plans that do not keep theirs, backward-filter's accumulators and the block buffers.
///
/// They grow to the largest layer run on each thread and stay at that size (so that the next
/// call allocates nothing); a plan's own kept kernels are not counted
/// ([`WinogradPlan::kept_bytes`]). A workspace in use by a pass running at the time counts 0.
pub fn workspace_bytes() -> usize {
    on_every_thread(thread_workspace_bytes)
}

/// Frees fastconv's per-thread workspaces (see [`workspace_bytes`]) on the calling thread and
/// on every thread of the current rayon pool; returns the bytes freed.
///
/// For a caller that measured large layers once (`nn`'s `auto` algorithm choice tries Winograd
/// on every layer) and then runs only smaller ones: the workspaces would otherwise stay at the
/// largest measured layer's size for the life of the threads. The next call of any plan grows
/// them again to what it needs; results do not change. A workspace in use by a pass running at
/// the time (on another thread of the pool) is left as it is.
pub fn release_workspaces() -> usize {
    on_every_thread(release_thread_workspaces)
}

/// Sums `f` over the calling thread and every thread of the current rayon pool (the calling
/// thread once if it is one of them).
fn on_every_thread(f: fn() -> usize) -> usize {
    let pool: usize = rayon::broadcast(|_| f()).into_iter().sum();
    if rayon::current_thread_index().is_some() {
        pool
    } else {
        pool + f()
    }
}

/// Bytes held by the calling thread's workspaces (0 for one in use).
fn thread_workspace_bytes() -> usize {
    let u = SHARED_U.with(|c| c.try_borrow().map_or(0, |u| 4 * u.capacity()));
    let fw = FILTER_WORK.with(|c| c.try_borrow().map_or(0, |w| w.bytes()));
    u + fw + crate::tiled::pool_bytes()
}

/// Frees the calling thread's workspaces (not one in use); returns the bytes freed.
fn release_thread_workspaces() -> usize {
    let u = SHARED_U.with(|c| {
        c.try_borrow_mut().map_or(0, |mut u| {
            4 * std::mem::replace(&mut *u, PackedKernels::empty()).capacity()
        })
    });
    let fw = FILTER_WORK.with(|c| {
        c.try_borrow_mut()
            .map_or(0, |mut w| std::mem::take(&mut *w).bytes())
    });
    u + fw + crate::tiled::release_pool()
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
    keep_kernels: bool,
    cache_fwd: Option<KernelCache>,
    cache_bwd: Option<KernelCache>,
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
        // The transforms are synthesized once per process and shared by every plan.
        let fwd: Vec<_> = tile
            .iter()
            .zip(kernel)
            .map(|(&m, &r)| forms_for(m, r))
            .collect::<Result<_>>()?;
        let bf: Vec<_> = filter_tile
            .iter()
            .zip(kernel)
            .map(|(&mp, &r)| forms_for(r, mp))
            .collect::<Result<_>>()?;
        Ok(WinogradPlan {
            geom: *geom,
            tile,
            filter_tile,
            fwd: TileTransforms::from_forms(fwd),
            bwd_filter: TileTransforms::from_forms(bf),
            block_tiles: None,
            gemm_path: GemmPath::default(),
            keep_kernels: true,
            cache_fwd: None,
            cache_bwd: None,
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

    /// Whether the plan keeps its transformed kernels between calls (default `true`).
    ///
    /// Kept (`true`, for evaluation and inference): forward and backward-data each hold their
    /// transformed kernels, packed for the GEMMs (about α^N / r^N times the weights each, F(4, 3)
    /// in 2-D: 4×), and a copy of the weights they came from; a call with the same weights skips
    /// the transform. Not kept (`false`, for training, where the weights change every step so
    /// the cache never hits): every forward and backward-data transforms the kernels into a
    /// buffer of the calling thread shared by every plan, and the plan holds no kernel data
    /// between calls; setting `false` frees what was kept. Both modes give bit-identical
    /// results. Backward-filter's buffers are shared per thread in both modes.
    pub fn set_keep_kernels(&mut self, keep: bool) {
        self.keep_kernels = keep;
        if !keep {
            self.cache_fwd = None;
            self.cache_bwd = None;
        }
    }

    /// Whether the plan keeps its transformed kernels between calls
    /// ([`WinogradPlan::set_keep_kernels`]).
    pub fn keeps_kernels(&self) -> bool {
        self.keep_kernels
    }

    /// Bytes of kernel data the plan holds between calls: the kept transformed kernels and
    /// weight copies of forward and backward-data (0 when it does not keep them, or before its
    /// first call).
    pub fn kept_bytes(&self) -> usize {
        [&self.cache_fwd, &self.cache_bwd]
            .into_iter()
            .flatten()
            .map(|c| 4 * (c.w_bits.capacity() + c.u.capacity()))
            .sum()
    }

    /// Chooses how forward and backward-data run their transformed-domain products (default
    /// [`GemmPath::Panels`]); both give the same results up to rounding.
    pub fn set_gemm_path(&mut self, path: GemmPath) {
        self.gemm_path = path;
    }

    /// Tiles per block: the explicit setting, or `default` capped so that every thread of the
    /// current pool gets a block (`tiles` = tiles of the pass).
    fn block(&self, default: usize, tiles: usize) -> usize {
        self.block_tiles.unwrap_or_else(|| {
            let threads = rayon::current_num_threads().max(1);
            default.min(tiles.div_ceil(threads).max(1))
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

    /// Runs `run` on the transformed kernels of the `outer × inner` kernels of `src` (kernel
    /// (row, col) as [`KernelSource`] says), packed as α^N matrices `U_ξᵀ` (outer × inner) in
    /// core-blas's micro-panels.
    ///
    /// With `keep` the plan's `cache` holds them under `w`'s bits and a call with the same
    /// weights skips the transform; a changed `w` is transformed into the cache's own storage.
    /// Without it the plan holds nothing: they are transformed into the thread's [`SHARED_U`]
    /// (shared by every plan on this thread, grown to the largest layer once) and `cache` is
    /// left empty. Either way by [`PackedKernels::transform_from`], so both give the same bits.
    fn with_kernels<R>(
        keep: bool,
        cache: &mut Option<KernelCache>,
        tt: &TileTransforms,
        src: KernelSource<'_>,
        dims: (usize, usize),
        run: impl FnOnce(&PackedKernels) -> Result<R>,
    ) -> Result<R> {
        let w = src.w;
        if !keep {
            *cache = None;
            return SHARED_U.with(|cell| match cell.try_borrow_mut() {
                Ok(mut u) => {
                    Self::transform_kernels(&mut u, tt, src, dims)?;
                    run(&u)
                }
                // Only when a pass runs inside another pass on this thread (a rayon worker
                // stealing a job while it waits); a private buffer is still correct.
                Err(_) => {
                    let mut u = PackedKernels::empty();
                    Self::transform_kernels(&mut u, tt, src, dims)?;
                    run(&u)
                }
            });
        }
        let c = match cache.take() {
            Some(c) if c.matches(w) => c,
            old => {
                // The previous cache (if any) gives its storage to the new one; on an error
                // the cache stays empty.
                let mut c = old.unwrap_or_else(|| KernelCache {
                    w_bits: Vec::new(),
                    u: PackedKernels::empty(),
                });
                Self::transform_kernels(&mut c.u, tt, src, dims)?;
                c.w_bits.clear();
                c.w_bits.extend(w.iter().map(|v| v.to_bits()));
                c
            }
        };
        run(&cache.insert(c).u)
    }

    /// The kernel transform of the `(inner, outer)` kernels of `src` into `u`, in
    /// core-blas's panel height.
    fn transform_kernels(
        u: &mut PackedKernels,
        tt: &TileTransforms,
        src: KernelSource<'_>,
        (inner, outer): (usize, usize),
    ) -> Result<()> {
        let taps: usize = tt.kernel().iter().product();
        debug_assert_eq!(src.w.len(), taps * inner * outer);
        let (mr, _) = core_blas::Gemm::global()?.tile();
        u.transform_from(&tt.lane_transform(), src, (outer, inner), mr);
        Ok(())
    }

    /// Forward pass `y = conv(x, w)` (no bias): x N×C×spatial, w K×C×kernel, y N×K×output
    /// (overwritten: every entry is written, so `y` needs no clearing).
    pub fn forward(&mut self, x: &[f32], w: &[f32], y: &mut [f32]) -> Result<()> {
        let g = self.geom;
        self.check("x", x.len(), g.x_len())?;
        self.check("w", w.len(), g.w_len())?;
        self.check("y", y.len(), g.y_len())?;
        let (c, k, taps) = (g.in_channels(), g.out_channels(), g.kernel_len());
        // U[ξ][c][k]: kernel (row k, column c) is w[k][c][..].
        let src = KernelSource {
            w,
            row_stride: c * taps,
            col_stride: taps,
            flip: false,
        };
        let job = Correlation {
            batch: g.batch(),
            in_channels: c,
            out_channels: k,
            input: g.input().to_vec(),
            output: g.output().to_vec(),
            pad_before: g.pad_before().iter().map(|&p| p as isize).collect(),
        };
        let alpha_n: usize = self.fwd.in_tile().iter().product();
        let block = self.block(
            default_block_tiles(alpha_n, c, k),
            self.tiles(g.output(), &self.tile),
        );
        let (tt, path) = (&self.fwd, self.gemm_path);
        Self::with_kernels(
            self.keep_kernels,
            &mut self.cache_fwd,
            tt,
            src,
            (c, k),
            |u| correlate(&job, tt, u, x, y, block, path),
        )
    }

    /// Backward-data pass `dx = ∂⟨y, dy⟩/∂x`: dy N×K×output, w K×C×kernel, dx N×C×input
    /// (overwritten, as `y` of [`WinogradPlan::forward`]).
    /// Computed as a forward correlation of `dy` with the flipped, transposed kernel and padding
    /// `r − 1 − pad_before` per dimension.
    pub fn backward_data(&mut self, dy: &[f32], w: &[f32], dx: &mut [f32]) -> Result<()> {
        let g = self.geom;
        self.check("dy", dy.len(), g.y_len())?;
        self.check("w", w.len(), g.w_len())?;
        self.check("dx", dx.len(), g.x_len())?;
        let (c, k, taps) = (g.in_channels(), g.out_channels(), g.kernel_len());
        // U[ξ][k][c]: kernel (row c, column k) is w[k][c][..] flipped (every spatial index
        // reversed: on the row-major flat tap index, taps − 1 − s).
        let src = KernelSource {
            w,
            row_stride: taps,
            col_stride: c * taps,
            flip: true,
        };
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
        let block = self.block(
            default_block_tiles(alpha_n, k, c),
            self.tiles(g.input(), &self.tile),
        );
        let (tt, path) = (&self.fwd, self.gemm_path);
        Self::with_kernels(
            self.keep_kernels,
            &mut self.cache_bwd,
            tt,
            src,
            (k, c),
            |u| correlate(&job, tt, u, dy, dx, block, path),
        )
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
        let (c, k) = (g.in_channels(), g.out_channels());
        let default = default_filter_block_tiles(alpha_n, c, k);
        let block = self.block(default, tiles);
        // With one accumulator shared by the threads, they share each block: one thread's size.
        let shared_block = self.block_tiles.unwrap_or(default);
        let mut run = |ws: &mut FilterWorkspace| {
            crate::filter_grad::backward_filter(
                &g,
                &self.bwd_filter,
                x,
                dy,
                dw,
                block,
                shared_block,
                crate::filter_grad::SHARED_ACC_BYTES,
                ws,
            )
        };
        FILTER_WORK.with(|cell| match cell.try_borrow_mut() {
            Ok(mut ws) => run(&mut ws),
            // Only when a pass runs inside another pass on this thread (a rayon worker stealing
            // a job while it waits); a private workspace is still correct.
            Err(_) => run(&mut FilterWorkspace::default()),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ntransform::SparseTransform;
    use crate::points::tabulated;

    fn geom(c: usize, k: usize, n: usize, r: &[usize]) -> ConvGeometry {
        let rank = r.len();
        ConvGeometry::new(1, c, k, &vec![n; rank], r)
            .and_then(|g| g.with_padding(&[1]))
            .unwrap()
    }

    /// Every dimension's forms of `a` and `b` are the same allocation.
    fn shared(a: &TileTransforms, b: &TileTransforms) -> bool {
        a.forms().len() == b.forms().len()
            && a.forms()
                .iter()
                .zip(b.forms())
                .all(|(x, y)| Arc::ptr_eq(x, y))
    }

    /// Plans with the same F(m, r) share the transforms' floating-point forms (process-wide
    /// cache), whatever their channels or sizes; and those forms are the rounding of a freshly
    /// synthesized (uncached) transform.
    #[test]
    fn plans_share_transforms() {
        let g = geom(4, 6, 13, &[3, 3]);
        let a = WinogradPlan::new(&g, Some(&[4])).unwrap();
        let b = WinogradPlan::new(&g, Some(&[4])).unwrap();
        // Other channels and size, same F(4, 3) / F(3, 4).
        let c = WinogradPlan::new(&geom(8, 2, 9, &[3, 3]), Some(&[4])).unwrap();
        for p in [&b, &c] {
            assert!(shared(&a.fwd, &p.fwd));
            assert!(shared(&a.bwd_filter, &p.bwd_filter));
        }
        // Both dimensions of one plan share one F(4, 3); F(2, 3) is another one.
        assert!(Arc::ptr_eq(&a.fwd.forms()[0], &a.fwd.forms()[1]));
        let d = WinogradPlan::new(&g, Some(&[2])).unwrap();
        assert!(!Arc::ptr_eq(&a.fwd.forms()[0], &d.fwd.forms()[0]));
        // A 3-D plan with a different kernel per dimension shares F(4, 3) with the 2-D ones.
        let e = WinogradPlan::new(&geom(2, 2, 9, &[3, 2, 3]), Some(&[4])).unwrap();
        assert!(Arc::ptr_eq(&a.fwd.forms()[0], &e.fwd.forms()[0]));
        assert!(!Arc::ptr_eq(&e.fwd.forms()[0], &e.fwd.forms()[1]));

        for (tt, m, r) in [(&a.fwd, 4, 3), (&a.bwd_filter, 3, 4), (&d.fwd, 2, 3)] {
            let fresh = tabulated(m, r).unwrap().transform().unwrap();
            let f = &tt.forms()[0];
            let dense32 = |q| SparseTransform::<f32>::from_rational(q).to_dense();
            assert_eq!(f.at.to_dense(), dense32(fresh.at()));
            assert_eq!(f.bt.to_dense(), dense32(fresh.bt()));
            assert_eq!(f.g32.to_dense(), dense32(fresh.g()));
            assert_eq!(
                f.g.to_dense(),
                SparseTransform::<f64>::from_rational(fresh.g()).to_dense()
            );
        }
    }
}
