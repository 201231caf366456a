//! deconvgemm: backward-data as the GEMM Wᵀ·dY whose C is never stored: each finished micro-tile
//! is added straight into dx through the col2im map (the convgemm paper's Fig. 7), so the only
//! buffer is the micro-tile the GEMM hands over.
//!
//! Two tiles of C can land on the same element of dx (neighbouring kernel taps overlap), so the
//! paper unpacks sequentially. Here the work is split so that threads never share an element of
//! dx: by blocks of whole input channels when the group has at least as many channels as
//! threads (rows of C for different channels hit different planes of dx), otherwise by blocks of
//! images (columns of C for different images hit different images of dx). Each block runs its
//! own single-threaded GEMM, all blocks in parallel.

use core_blas::{MatRef, Store, Tile};

use crate::Result;
use crate::error::gemm_err;
use crate::geometry::{ConvGeometry, Dims3};
use crate::im2col::split3;
use crate::layout::ChannelMajor;

/// Adds tiles of C = (C/G·R) × (N·O) (rows `row0..`, columns `col0..` of the full product) into
/// dx through the col2im map.
struct Col2imStore {
    ptr: *mut f32,
    len: usize,
    d: Dims3,
    group_off: usize,
    image: usize,
    ilen: usize,
    rlen: usize,
    olen: usize,
    row0: usize,
    col0: usize,
    rows: usize,
    cols: usize,
}

// SAFETY: `store_tile` is only ever called from one thread per store (`concurrent() == false`),
// and the stores that run at the same time cover disjoint channel or image blocks of dx, so no
// element is written by two threads; the `&mut dx` borrow held by `backward_data` outlives them.
unsafe impl Sync for Col2imStore {}

impl Store for Col2imStore {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn concurrent(&self) -> bool {
        false
    }
    fn store_tile(&self, tile: &Tile<'_>) {
        let d = &self.d;
        let out = &d.output;
        let (s, wid) = (d.stride[2] as isize, d.input[2] as isize);
        for r in 0..tile.rows() {
            let row = self.row0 + tile.i() + r;
            let (c, tap) = (row / self.rlen, row % self.rlen);
            let rk = split3(tap, &d.kernel);
            let vals = tile.row(r);
            let mut t = 0;
            while t < tile.cols() {
                let j = self.col0 + tile.j() + t;
                let (n, o) = (j / self.olen, j % self.olen);
                let (o0, o1, o2) = (o / (out[1] * out[2]), (o / out[2]) % out[1], o % out[2]);
                let len = (tile.cols() - t).min(out[2] - o2);
                let run = &vals[t..t + len];
                t += len;
                let i0 = d.input_coord(0, o0, rk[0]);
                let i1 = d.input_coord(1, o1, rk[1]);
                if i0 < 0 || i0 >= d.input[0] as isize || i1 < 0 || i1 >= d.input[1] as isize {
                    continue;
                }
                let line = self.group_off
                    + n * self.image
                    + c * self.ilen
                    + (i0 as usize * d.input[1] + i1 as usize) * d.input[2];
                debug_assert!(line + d.input[2] <= self.len);
                // SAFETY: `line .. line + input[2]` is one line of one input plane inside dx
                // (bounds asserted above; coordinates validated by the geometry), and only this
                // thread writes this plane now (see the `Sync` impl).
                let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(line), d.input[2]) };
                let first = d.input_coord(2, o2, rk[2]);
                if s == 1 {
                    let lo = (-first).clamp(0, len as isize) as usize;
                    let hi = (wid - first).clamp(lo as isize, len as isize) as usize;
                    if lo < hi {
                        let from = (first + lo as isize) as usize;
                        for (x, &v) in dst[from..from + (hi - lo)].iter_mut().zip(&run[lo..hi]) {
                            *x += v;
                        }
                    }
                } else {
                    for (u, &v) in run.iter().enumerate() {
                        let i2 = first + u as isize * s;
                        if i2 >= 0 && i2 < wid {
                            dst[i2 as usize] += v;
                        }
                    }
                }
            }
        }
    }
}

/// dx = backward-data(dy, w) by deconvgemm (dx is overwritten). Inputs are validated by the
/// caller.
pub(crate) fn backward_data(g: &ConvGeometry, dy: &[f32], w: &[f32], dx: &mut [f32]) -> Result<()> {
    dx.fill(0.0);
    let (cg, kg) = (g.in_channels_per_group(), g.out_channels_per_group());
    let (rlen, olen) = (g.kernel_len(), g.output_spatial_len());
    let threads = rayon::current_num_threads().max(1);
    // Partition: (channel ranges, image ranges), one GEMM each.
    let by_channel = cg >= threads || g.batch() < threads;
    let parts = if by_channel {
        threads.min(cg)
    } else {
        threads.min(g.batch())
    };
    let (ptr, len) = (dx.as_mut_ptr() as usize, dx.len());
    let d = g.dims3();
    let ilen = g.input_spatial_len();
    let run_part = |grp: usize, part: usize| -> Result<()> {
        let (c_lo, c_hi, n_lo, n_hi) = if by_channel {
            (cg * part / parts, cg * (part + 1) / parts, 0, g.batch())
        } else {
            (
                0,
                cg,
                g.batch() * part / parts,
                g.batch() * (part + 1) / parts,
            )
        };
        if c_lo == c_hi || n_lo == n_hi {
            return Ok(());
        }
        // A = W_gᵀ rows c_lo·R..c_hi·R: W_g is Kg × (Cg·R) row-major.
        let wg = &w[grp * kg * cg * rlen..][..kg * cg * rlen];
        let a = MatRef::new(
            "w",
            &wg[c_lo * rlen..],
            (c_hi - c_lo) * rlen,
            kg,
            1,
            cg * rlen,
        )
        .map_err(gemm_err)?;
        let b = ChannelMajor {
            data: dy,
            channels: g.out_channels(),
            plane: olen,
            c0: grp * kg,
            rows: kg,
            n0: n_lo,
            batch: n_hi - n_lo,
        };
        let mut store = Col2imStore {
            ptr: ptr as *mut f32,
            len,
            d,
            group_off: grp * cg * ilen,
            image: g.in_channels() * ilen,
            ilen,
            rlen,
            olen,
            row0: c_lo * rlen,
            col0: n_lo * olen,
            rows: (c_hi - c_lo) * rlen,
            cols: (n_hi - n_lo) * olen,
        };
        core_blas::gemm_with(&a, &b, &mut store).map_err(gemm_err)
    };
    for grp in 0..g.groups() {
        if parts <= 1 {
            run_part(grp, 0)?;
        } else {
            use rayon::prelude::*;
            (0..parts)
                .into_par_iter()
                .try_for_each(|part| run_part(grp, part))?;
        }
    }
    Ok(())
}
