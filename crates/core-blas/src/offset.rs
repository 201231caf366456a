//! Offset-list kernels: register tiles whose operands are read in place, each vector at
//! `base + offset` in a flat buffer, with no packing.
//!
//! - [`Gemm::offset_tile`] (the forward tile of a direct convolution): for `m` rows (1..=
//!   [`OFFSET_MR`]), runs based at `src[v]` (1..=[`offset_tile_vectors`]`(m)` of them) and the
//!   steps `s` of a range of an [`Offsets`] list,
//!
//!   `acc[i][v][l] (:= or +=) Σ_s w[(s − start) · MR + i] · x[src[v] + offs[s] + l]`, `l < 8`,
//!
//!   summed in step order. `w` is a panel of `MR` values per step (the first `m` used; the rest
//!   may hold anything, typically zeros).
//! - [`Gemm::offset_wide_tile`] (the `avx512` family only, [`Gemm::offset_lanes`] 16): the
//!   same sums on runs of [`WIDE_LANES`] (16) values, up to [`WIDE_MR`] (8) rows and
//!   [`wide_tile_vectors`]`(m)` runs (8 × 3 or 6 × 4 zmm accumulators), `w` a panel of
//!   [`WIDE_MR`] values per step.
//! - [`Gemm::offset_dot_tile`] (the backward-filter tile): for `m` rows of `dy` (1..=[`DOT_MR`])
//!   and columns `j` of a range of an [`Offsets`] list (1..=[`DOT_NC`] of them),
//!
//!   `acc[i][j] (:= or +=) Σ_r Σ_l dy[i · ldd + r · 8 + l] · x[runs[r] + offs[j] + l]`, `l < 8`:
//!
//!   per row and column the 8 lane sums accumulated over the runs in order, then the lanes added.
//!   [`Gemm::offset_dot_rows`] does every column of the list, adding the sums into whole rows of
//!   an output (arguments checked once per call).
//!
//! - [`Gemm::offset_a_tile`] (the "offset-A" tile, a GEMM tile whose A is read in place): for
//!   `m` pixels (1..=`MR`) at any bases `bases[i]` and `NR` output channels of a packed Wᵀ panel
//!   of `NR` values per step, where `(MR, NR)` is the family's [`Gemm::offset_a_shape`] (6 × 16
//!   on `scalar` and `avx2`, 12 × 32 on `avx512`),
//!
//!   `acc[i][c] (:= or +=) Σ_s x[bases[i] + offs[s]] · wt[(s − start) · NR + c]`, `c < NR`,
//!
//!   summed in step order; [`Gemm::offset_a_store`] stores the same sums transposed (channel `c`
//!   of pixel `i` at `y[dst[i] + c · ldy]`), with a bias and ReLU if asked. Unlike the offset tile, no
//!   lane is lost on lines narrower than a multiple of 8 pixels.
//!
//! The kernels know nothing of convolution: a direct convolution makes `x` a zero-padded input,
//! a step per (input channel, tap) with its offset, and a run per 8 consecutive outputs with its
//! base. Bounds are checked once per call against the lists' precomputed maxima, so a call costs
//! O(runs) checks, not O(steps). Families: `scalar` (portable 8-lane arrays, multiply then add),
//! `avx2` (256-bit FMA), `avx512` (the offset and dot tiles: the same 256-bit bodies compiled
//! with AVX-512F, their contract is 8 lanes wide; the wide offset tile and the offset-A tile:
//! 512-bit vectors). Results of different families may differ in the last bits (FMA rounds once).

use std::ops::Range;

use crate::isa::Family;
use crate::kernel::offset::{ATileFamily, a_tile_any, dot_any, tile_any};
use crate::{Error, Gemm};

/// Values per vector of the offset kernels (one 256-bit vector of f32, on every family).
pub const OFFSET_LANES: usize = 8;
/// Rows of an [`Gemm::offset_tile`] (w values broadcast per step).
pub const OFFSET_MR: usize = 6;
/// The most runs (vectors of 8 values) an offset tile holds (with one row; see
/// [`offset_tile_vectors`]).
pub const OFFSET_NV: usize = 6;
/// Rows of an [`Gemm::offset_dot_tile`] (dy rows kept in registers).
pub const DOT_MR: usize = 3;
/// Columns of an [`Gemm::offset_dot_tile`] (offsets into x).
pub const DOT_NC: usize = 4;

/// Values per vector of the wide offset tile ([`Gemm::offset_wide_tile`]: one 512-bit vector
/// of f32, the `avx512` family only).
pub const WIDE_LANES: usize = 16;
/// The most rows of a wide offset tile (w values broadcast per step).
pub const WIDE_MR: usize = 8;
/// The most runs (vectors of 16 values) a wide offset tile holds (see [`wide_tile_vectors`]).
pub const WIDE_NV: usize = 4;

/// The accumulators of a wide offset tile: `acc[i][v]` is run `v` of row `i`.
pub type WideTile = [[[f32; WIDE_LANES]; WIDE_NV]; WIDE_MR];

/// Runs per wide offset tile for `m` rows: the `m · runs` accumulators, the loaded x vectors
/// and one broadcast fit the 32 vector registers of AVX-512 (0..=6 → 4, otherwise 3).
pub const fn wide_tile_vectors(m: usize) -> usize {
    if m <= 6 { 4 } else { 3 }
}

/// The most pixels of an [`Gemm::offset_a_tile`] on any family (x values broadcast per step;
/// a family's own count is [`Gemm::offset_a_shape`]`.0`).
pub const OFFSET_A_MR: usize = 12;
/// The most output channels of an [`Gemm::offset_a_tile`] on any family (Wᵀ values per step:
/// two vectors; a family's own count is [`Gemm::offset_a_shape`]`.1`).
pub const OFFSET_A_NR: usize = 32;

/// The accumulators of an offset-A tile: `acc[i][c]` is channel `c` of pixel `i` (the first
/// [`Gemm::offset_a_shape`] pixels and channels used).
pub type OffsetATile = [[f32; OFFSET_A_NR]; OFFSET_A_MR];

/// How [`Gemm::offset_a_store`] writes its sums into y.
#[derive(Clone, Copy, Debug)]
pub enum OffsetAStore<'a> {
    /// `y = sum (+ bias[c])`: y is not read (it may hold anything, NaN included).
    Set {
        /// Per-channel values added to the sums (at least `channels` of them).
        bias: Option<&'a [f32]>,
    },
    /// `y += sum`.
    Add,
}

/// The accumulators of an offset tile: `acc[i][v]` is run `v` of row `i`.
pub type OffsetTile = [[[f32; OFFSET_LANES]; OFFSET_NV]; OFFSET_MR];
/// The accumulators of an offset dot tile: `acc[i][j]`.
pub type DotTile = [[f32; DOT_NC]; DOT_MR];

/// Runs per offset tile for `m` rows: the `m · runs` accumulators, the loaded x vectors and one
/// broadcast fit the 16 vector registers of AVX2 (0 | 1 → 6, 2 → 4, 3 → 3, otherwise 2).
pub const fn offset_tile_vectors(m: usize) -> usize {
    match m {
        0 | 1 => 6,
        2 => 4,
        3 => 3,
        _ => 2,
    }
}

/// A list of offsets into a flat buffer, with its largest value precomputed (so that a kernel
/// call checks its bases once against it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offsets {
    offs: Vec<usize>,
    max: usize,
}

impl Offsets {
    /// The list (in order).
    pub fn new(offs: Vec<usize>) -> Offsets {
        let max = offs.iter().copied().max().unwrap_or(0);
        Offsets { offs, max }
    }

    /// The offsets.
    pub fn as_slice(&self) -> &[usize] {
        &self.offs
    }

    /// Number of offsets.
    pub fn len(&self) -> usize {
        self.offs.len()
    }

    /// No offsets.
    pub fn is_empty(&self) -> bool {
        self.offs.is_empty()
    }

    /// The largest offset (0 when empty).
    pub fn max(&self) -> usize {
        self.max
    }
}

#[cold]
fn shape(arg: &'static str, expected: String, got: String) -> Error {
    Error::ShapeMismatch { arg, expected, got }
}

/// `Ok(range)` if `range` lies within `0..len` and is not reversed.
fn check_range(arg: &'static str, r: &Range<usize>, len: usize) -> Result<(), Error> {
    if r.start > r.end || r.end > len {
        return Err(shape(
            arg,
            format!("a range within 0..{len}"),
            format!("{}..{}", r.start, r.end),
        ));
    }
    Ok(())
}

/// `base + max + 8 <= x.len()`, or the error naming `x`.
fn check_reach(base: usize, max: usize, x: &[f32]) -> Result<(), Error> {
    check_reach_lanes(base, max, OFFSET_LANES, x)
}

/// `base + max + lanes <= x.len()`, or the error naming `x`.
fn check_reach_lanes(base: usize, max: usize, lanes: usize, x: &[f32]) -> Result<(), Error> {
    match base.checked_add(max).and_then(|v| v.checked_add(lanes)) {
        Some(end) if end <= x.len() => Ok(()),
        end => Err(Error::SliceTooShort {
            arg: "x",
            len: x.len(),
            needed: end.unwrap_or(usize::MAX),
        }),
    }
}

/// The argument checks of both offset tiles: `m` in 1..=`mr` rows, 1..=`vectors` runs (`src`),
/// `steps` within `offs`, `w` holding `steps.len() · mr` values and every run's base reaching
/// `offs.max() + lanes` values inside `x`. Returns each run's pointer into `x` (unused entries
/// point at `x`'s start).
#[allow(clippy::too_many_arguments)]
fn tile_args<const NV: usize>(
    m: usize,
    mr: usize,
    vectors: usize,
    lanes: usize,
    w: &[f32],
    offs: &Offsets,
    steps: &Range<usize>,
    x: &[f32],
    src: &[usize],
) -> Result<[*const f32; NV], Error> {
    if !(1..=mr).contains(&m) {
        return Err(shape("m", format!("1..={mr}"), m.to_string()));
    }
    if !(1..=vectors).contains(&src.len()) {
        return Err(shape(
            "src",
            format!("1..={vectors} runs for {m} rows"),
            src.len().to_string(),
        ));
    }
    check_range("steps", steps, offs.len())?;
    let needed = steps.len() * mr;
    if w.len() < needed {
        return Err(Error::SliceTooShort {
            arg: "w",
            len: w.len(),
            needed,
        });
    }
    let mut ptrs = [x.as_ptr(); NV];
    for (p, &base) in ptrs.iter_mut().zip(src) {
        check_reach_lanes(base, offs.max, lanes, x)?;
        // `base < x.len()` (checked above): inside the slice.
        *p = x.as_ptr().wrapping_add(base);
    }
    Ok(ptrs)
}

impl Gemm {
    /// The offset tile (module [`mod@crate::offset`]): `acc[i][v][l] (:= or +=, as
    /// `accumulate`) Σ_{s ∈ steps} w[(s − steps.start) · MR + i] · x[src[v] + offs[s] + l]` for
    /// `i < m`, `v < src.len()`, `l < 8`, steps in ascending order; other entries of `acc` are
    /// left as they are. The bases are checked against `offs.max()` (the whole list).
    ///
    /// Errors: [`Error::ShapeMismatch`] on `m` (not in 1..=[`OFFSET_MR`]), `src` (count not in
    /// 1..=[`offset_tile_vectors`]`(m)`) or `steps` (not within the list);
    /// [`Error::SliceTooShort`] on `w` (fewer than `steps.len() · MR` values) or `x` (some
    /// `src[v] + offs.max() + 8` past its end).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn offset_tile(
        &self,
        m: usize,
        w: &[f32],
        offs: &Offsets,
        steps: Range<usize>,
        x: &[f32],
        src: &[usize],
        acc: &mut OffsetTile,
        accumulate: bool,
    ) -> Result<(), Error> {
        let runs = src.len();
        let ptrs: [*const f32; OFFSET_NV] = tile_args(
            m,
            OFFSET_MR,
            offset_tile_vectors(m),
            OFFSET_LANES,
            w,
            offs,
            &steps,
            x,
            src,
        )?;
        let (o, wp) = (&offs.offs[steps], w.as_ptr());
        // SAFETY: m and runs are in range (checked); w holds steps·MR values (checked); every
        // run reads x[base + o .. base + o + 8] with o <= max and base + max + 8 <= x.len()
        // (checked); holding the family value proves its target features.
        unsafe {
            match self.family {
                Family::Scalar(k) => tile_any(k, m, runs, o, wp, &ptrs, acc, accumulate),
                #[cfg(target_arch = "x86_64")]
                Family::Avx2(k) => tile_any(k, m, runs, o, wp, &ptrs, acc, accumulate),
                #[cfg(target_arch = "x86_64")]
                Family::Avx512(k) => tile_any(k, m, runs, o, wp, &ptrs, acc, accumulate),
            }
        }
        Ok(())
    }

    /// Values per vector of the widest offset tile of this family: [`WIDE_LANES`] on `avx512`
    /// ([`Gemm::offset_wide_tile`]), [`OFFSET_LANES`] on the others (only
    /// [`Gemm::offset_tile`]).
    pub fn offset_lanes(&self) -> usize {
        match self.family {
            #[cfg(target_arch = "x86_64")]
            Family::Avx512(_) => WIDE_LANES,
            _ => OFFSET_LANES,
        }
    }

    /// The wide offset tile: [`Gemm::offset_tile`] on runs of [`WIDE_LANES`] values, up to
    /// [`WIDE_MR`] rows and [`wide_tile_vectors`]`(m)` runs, `w` a panel of [`WIDE_MR`] values
    /// per step: `acc[i][v][l] (:= or +=, as `accumulate`) Σ_{s ∈ steps} w[(s − steps.start) ·
    /// WIDE_MR + i] · x[src[v] + offs[s] + l]` for `i < m`, `v < src.len()`, `l < 16`, steps in
    /// ascending order; other entries of `acc` are left as they are. Only the `avx512` family
    /// has it ([`Gemm::offset_lanes`] is then 16).
    ///
    /// Errors: [`Error::IsaUnavailable`] on another family; [`Error::ShapeMismatch`] on `m`
    /// (not in 1..=[`WIDE_MR`]), `src` (count not in 1..=[`wide_tile_vectors`]`(m)`) or `steps`
    /// (not within the list); [`Error::SliceTooShort`] on `w` (fewer than `steps.len() ·
    /// WIDE_MR` values) or `x` (some `src[v] + offs.max() + 16` past its end).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn offset_wide_tile(
        &self,
        m: usize,
        w: &[f32],
        offs: &Offsets,
        steps: Range<usize>,
        x: &[f32],
        src: &[usize],
        acc: &mut WideTile,
        accumulate: bool,
    ) -> Result<(), Error> {
        #[cfg(target_arch = "x86_64")]
        let Family::Avx512(k) = self.family else {
            return Err(Error::IsaUnavailable {
                requested: "avx512 (the wide offset tile)",
                available: self.isa().name().to_string(),
            });
        };
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (m, w, offs, steps, x, src, acc, accumulate);
            return Err(Error::IsaUnavailable {
                requested: "avx512 (the wide offset tile)",
                available: self.isa().name().to_string(),
            });
        }
        #[cfg(target_arch = "x86_64")]
        {
            let runs = src.len();
            let ptrs: [*const f32; WIDE_NV] = tile_args(
                m,
                WIDE_MR,
                wide_tile_vectors(m),
                WIDE_LANES,
                w,
                offs,
                &steps,
                x,
                src,
            )?;
            let (o, wp) = (&offs.offs[steps], w.as_ptr());
            // SAFETY: m and runs are in range (checked); w holds steps·WIDE_MR values
            // (checked); every run reads x[base + o .. base + o + 16] with o <= max and
            // base + max + 16 <= x.len() (checked); holding the Avx512 value proves AVX-512F.
            unsafe {
                crate::kernel::skx_offset::wide_any(k, m, runs, o, wp, &ptrs, acc, accumulate)
            };
            Ok(())
        }
    }

    /// The offset dot tile (module [`mod@crate::offset`]): `acc[i][j] (:= or +=, as
    /// `accumulate`) Σ_r Σ_l dy[i · ldd + r · 8 + l] · x[runs[r] + offs[cols.start + j] + l]`
    /// for `i < m`, `j < cols.len()`, `r < runs.len()`, `l < 8`; other entries of `acc` are left
    /// as they are. x is checked against `runs.max() + offs.max()` (the whole lists).
    ///
    /// Errors: [`Error::ShapeMismatch`] on `m` (not in 1..=[`DOT_MR`]) or `cols` (length not in
    /// 1..=[`DOT_NC`], or not within the list); [`Error::LeadingDimension`] on `ldd` (below
    /// `runs.len() · 8` when `m > 1`); [`Error::SliceTooShort`] on `dy` (fewer than
    /// `(m − 1) · ldd + runs.len() · 8` values) or `x` (`runs.max() + offs.max() + 8` past its
    /// end, when there are runs).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn offset_dot_tile(
        &self,
        m: usize,
        dy: &[f32],
        ldd: usize,
        runs: &Offsets,
        offs: &Offsets,
        cols: Range<usize>,
        x: &[f32],
        acc: &mut DotTile,
        accumulate: bool,
    ) -> Result<(), Error> {
        if !(1..=DOT_MR).contains(&m) {
            return Err(shape("m", format!("1..={DOT_MR}"), m.to_string()));
        }
        check_range("cols", &cols, offs.len())?;
        let ncols = cols.len();
        if !(1..=DOT_NC).contains(&ncols) {
            return Err(shape(
                "cols",
                format!("1..={DOT_NC} columns"),
                ncols.to_string(),
            ));
        }
        let row = runs.len() * OFFSET_LANES;
        if m > 1 && ldd < row {
            return Err(Error::LeadingDimension {
                arg: "ldd",
                value: ldd,
                min: row,
            });
        }
        let needed = if row == 0 { 0 } else { (m - 1) * ldd + row };
        if dy.len() < needed {
            return Err(Error::SliceTooShort {
                arg: "dy",
                len: dy.len(),
                needed,
            });
        }
        let mut ptrs = [x.as_ptr(); DOT_NC];
        if !runs.is_empty() {
            check_reach(runs.max, offs.max, x)?;
            for (p, &o) in ptrs.iter_mut().zip(&offs.offs[cols]) {
                // `o <= offs.max < x.len()` (checked above): inside the slice.
                *p = x.as_ptr().wrapping_add(o);
            }
        }
        let (r, dp) = (runs.as_slice(), dy.as_ptr());
        // SAFETY: m and ncols are in range (checked); dy row i, run r reads
        // dy[i·ldd + r·8 .. + 8] inside `needed` (checked); column j, run r reads
        // x[o_j + runs[r] .. + 8] with o_j + runs[r] + 8 <= offs.max + runs.max + 8 <= x.len()
        // (checked); no runs: nothing is read. Holding the family value proves its features.
        unsafe {
            match self.family {
                Family::Scalar(k) => dot_any(k, m, ncols, r, dp, ldd, &ptrs, acc, accumulate),
                #[cfg(target_arch = "x86_64")]
                Family::Avx2(k) => dot_any(k, m, ncols, r, dp, ldd, &ptrs, acc, accumulate),
                #[cfg(target_arch = "x86_64")]
                Family::Avx512(k) => dot_any(k, m, ncols, r, dp, ldd, &ptrs, acc, accumulate),
            }
        }
        Ok(())
    }
}

/// `(pixels, channels, pixels at arbitrary bases)` of family `K`'s offset-A tile.
const fn a_shape<K: ATileFamily>() -> (usize, usize, usize) {
    (K::MR, K::NR, K::GENERAL_MR)
}

impl Gemm {
    /// `(pixels, channels)` of this family's offset-A tile ([`Gemm::offset_a_tile`]): at most
    /// ([`OFFSET_A_MR`], [`OFFSET_A_NR`]); 6 × 16 on `scalar` and `avx2`, 12 × 32 on `avx512`.
    /// `wt` panels hold `channels` values per step. Tiles whose pixels are a run (`bases[i] =
    /// bases[0] + i`) run at this size; at other bases, the avx512 tile runs as two halves
    /// (its 12 base pointers would spill), so callers should form runs where they can.
    pub fn offset_a_shape(&self) -> (usize, usize) {
        let (mr, nr, _) = self.a_shape();
        (mr, nr)
    }

    /// [`a_shape`] of this family.
    fn a_shape(&self) -> (usize, usize, usize) {
        match self.family {
            Family::Scalar(_) => a_shape::<crate::kernel::portable::Scalar>(),
            #[cfg(target_arch = "x86_64")]
            Family::Avx2(_) => a_shape::<crate::kernel::x86::Avx2>(),
            #[cfg(target_arch = "x86_64")]
            Family::Avx512(_) => a_shape::<crate::kernel::x86::Avx512>(),
        }
    }

    /// Checks an offset-A call and builds its x pointers: `(pixels, steps' offsets)`.
    fn a_args<'o>(
        &self,
        wt: &[f32],
        offs: &'o Offsets,
        steps: &Range<usize>,
        x: &[f32],
        bases: &[usize],
        xs: &mut [*const f32; OFFSET_A_MR],
    ) -> Result<(usize, &'o [usize]), Error> {
        let m = bases.len();
        let (mr, nr) = self.offset_a_shape();
        if !(1..=mr).contains(&m) {
            return Err(shape("bases", format!("1..={mr} pixels"), m.to_string()));
        }
        check_range("steps", steps, offs.len())?;
        let needed = steps.len() * nr;
        if wt.len() < needed {
            return Err(Error::SliceTooShort {
                arg: "wt",
                len: wt.len(),
                needed,
            });
        }
        for (p, &base) in xs.iter_mut().zip(bases) {
            // One value per step: base + max + 1 <= x.len().
            match base.checked_add(offs.max).and_then(|v| v.checked_add(1)) {
                Some(end) if end <= x.len() => {}
                end => {
                    return Err(Error::SliceTooShort {
                        arg: "x",
                        len: x.len(),
                        needed: end.unwrap_or(usize::MAX),
                    });
                }
            }
            // `base < x.len()` (checked above): inside the slice.
            *p = x.as_ptr().wrapping_add(base);
        }
        Ok((m, &offs.offs[steps.clone()]))
    }

    /// The offset-A tile (module [`mod@crate::offset`]), with `(MR, NR)` =
    /// [`Gemm::offset_a_shape`]: `acc[i][c] (:= or +=, as `accumulate`) Σ_{s ∈ steps}
    /// x[bases[i] + offs[s]] · wt[(s − steps.start) · NR + c]` for `i < bases.len()` (any
    /// bases), `c < NR`, steps in ascending order; rows `i >= bases.len()` and channels `c >= NR`
    /// of `acc` are left as they are. `wt` is a packed Wᵀ panel of `NR` values per step, all
    /// read (each channel's sums are independent, so channels the caller does not use may hold
    /// anything, NaN included). The bases are checked against `offs.max()` (the whole list).
    ///
    /// Errors: [`Error::ShapeMismatch`] on `bases` (count not in 1..=`MR`) or `steps` (not
    /// within the list); [`Error::SliceTooShort`] on `wt` (fewer than `steps.len() · NR`
    /// values) or `x` (some `bases[i] + offs.max()` past its end).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn offset_a_tile(
        &self,
        wt: &[f32],
        offs: &Offsets,
        steps: Range<usize>,
        x: &[f32],
        bases: &[usize],
        acc: &mut OffsetATile,
        accumulate: bool,
    ) -> Result<(), Error> {
        let mut xs = [x.as_ptr(); OFFSET_A_MR];
        let (m, o) = self.a_args(wt, offs, &steps, x, bases, &mut xs)?;
        let wp = wt.as_ptr();
        let run = bases.windows(2).all(|b| b[1] == b[0].wrapping_add(1));
        let general = self.a_shape().2;
        if run || m <= general {
            // SAFETY: m is in the family's range (checked); wt holds steps·NR values
            // (checked); pixel i reads x[base_i + o] with o <= max and base_i + max < x.len()
            // (checked; a run's pixel i is xs[0] + i = x + base_i); holding the family value
            // proves its target features.
            unsafe { self.a_dispatch(run, m, o, wp, &xs, acc, accumulate) };
            return Ok(());
        }
        // Arbitrary bases beyond the family's general tile: even parts of at most `general`
        // pixels, each on a copy of its rows (channels past NR keep their values).
        let part = m.div_ceil(m.div_ceil(general));
        for i0 in (0..m).step_by(part) {
            let mc = part.min(m - i0);
            let mut xp = [x.as_ptr(); OFFSET_A_MR];
            xp[..mc].copy_from_slice(&xs[i0..i0 + mc]);
            let mut ap: OffsetATile = [[0.0; OFFSET_A_NR]; OFFSET_A_MR];
            ap[..mc].copy_from_slice(&acc[i0..i0 + mc]);
            // SAFETY: as above, for the part's mc <= m pixels (their bases checked).
            unsafe { self.a_dispatch(false, mc, o, wp, &xp, &mut ap, accumulate) };
            acc[i0..i0 + mc].copy_from_slice(&ap[..mc]);
        }
        Ok(())
    }

    /// The family's offset-A kernel for `m` pixels (`run`: a run from `xs[0]`).
    ///
    /// # Safety
    /// As `kernel::offset::a_tile_body` for `M = m` (1..=[`OFFSET_A_MR`]).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    unsafe fn a_dispatch(
        &self,
        run: bool,
        m: usize,
        o: &[usize],
        wp: *const f32,
        xs: &[*const f32; OFFSET_A_MR],
        acc: &mut OffsetATile,
        accumulate: bool,
    ) {
        macro_rules! any {
            ($k:expr) => {
                if run {
                    a_tile_any::<_, true>($k, m, o, wp, xs, acc, accumulate)
                } else {
                    a_tile_any::<_, false>($k, m, o, wp, xs, acc, accumulate)
                }
            };
        }
        // SAFETY: the caller's contract; holding the family value proves its features.
        unsafe {
            match self.family {
                Family::Scalar(k) => any!(k),
                #[cfg(target_arch = "x86_64")]
                Family::Avx2(k) => any!(k),
                #[cfg(target_arch = "x86_64")]
                Family::Avx512(k) => any!(k),
            }
        }
    }

    /// The offset-A tile's sums ([`Gemm::offset_a_tile`] with `:=`) stored transposed into y,
    /// pixel `i` of channel `c` at `y[dst[i] + c · ldy]`, for `c < channels` (1..=`NR` of
    /// [`Gemm::offset_a_shape`]) and `i < bases.len()`:
    ///
    /// - [`OffsetAStore::Set`]: `y[…] = sum[i][c] (+ bias[c])` (y not read),
    /// - [`OffsetAStore::Add`]: `y[…] += sum[i][c]`,
    ///
    /// then `max(0, ·)` if `relu`. Other values of y are untouched. For a convolution, `dst[i]`
    /// is the tile's pixel `i` in the output plane of its first channel (any pixels: tiles may
    /// cross lines and images) and `ldy` the plane length. Destinations should be distinct (a
    /// repeated one receives each of its pixels' values in turn, in pixel order).
    ///
    /// Errors: as [`Gemm::offset_a_tile`]; [`Error::ShapeMismatch`] on `channels` (not in
    /// 1..=NR) or `dst` (not one per pixel); [`Error::SliceTooShort`] on `y` (some
    /// `dst[i] + (channels − 1) · ldy` past its end) or `bias` (fewer than `channels`).
    #[allow(clippy::too_many_arguments)]
    pub fn offset_a_store(
        &self,
        wt: &[f32],
        offs: &Offsets,
        steps: Range<usize>,
        x: &[f32],
        bases: &[usize],
        y: &mut [f32],
        dst: &[usize],
        ldy: usize,
        channels: usize,
        store: OffsetAStore<'_>,
        relu: bool,
    ) -> Result<(), Error> {
        let nr = self.offset_a_shape().1;
        if !(1..=nr).contains(&channels) {
            return Err(shape("channels", format!("1..={nr}"), channels.to_string()));
        }
        if dst.len() != bases.len() {
            return Err(shape(
                "dst",
                format!("{} destinations (one per pixel)", bases.len()),
                dst.len().to_string(),
            ));
        }
        for &d in dst {
            let end = (channels - 1)
                .checked_mul(ldy)
                .and_then(|v| v.checked_add(d))
                .and_then(|v| v.checked_add(1));
            match end {
                Some(end) if end <= y.len() => {}
                end => {
                    return Err(Error::SliceTooShort {
                        arg: "y",
                        len: y.len(),
                        needed: end.unwrap_or(usize::MAX),
                    });
                }
            }
        }
        let bias = match store {
            OffsetAStore::Set { bias: Some(b) } if b.len() < channels => {
                return Err(Error::SliceTooShort {
                    arg: "bias",
                    len: b.len(),
                    needed: channels,
                });
            }
            OffsetAStore::Set { bias } => Some(bias),
            OffsetAStore::Add => None,
        };
        let mut acc: OffsetATile = Default::default();
        self.offset_a_tile(wt, offs, steps, x, bases, &mut acc, false)?;
        for (a, &d) in acc.iter().zip(dst) {
            for (c, &v) in a[..channels].iter().enumerate() {
                let o = &mut y[d + c * ldy];
                let v = match bias {
                    Some(b) => v + b.map_or(0.0, |b| b[c]),
                    None => *o + v,
                };
                *o = if relu { v.max(0.0) } else { v };
            }
        }
        Ok(())
    }

    /// Whole rows of offset dot products, added into `out`: for `i < m` (1..=[`DOT_MR`]) and
    /// every column `j < offs.len()`,
    ///
    /// `out[i · ldo + j] += Σ_r Σ_l dy[i · ldd + r · 8 + l] · x[runs[r] + offs[j] + l]`, `l < 8`
    ///
    /// ([`Gemm::offset_dot_tile`] over the columns `DOT_NC` at a time, each tile's sums added to
    /// `out`; other values of `out` untouched). The arguments are checked once per call instead
    /// of once per tile, and the tiles' sums go straight into `out` (a direct convolution's
    /// weight-gradient rows: one call per (dy rows, run chunk)).
    ///
    /// Errors: as [`Gemm::offset_dot_tile`] for `m`, `ldd`, `dy` and `x`;
    /// [`Error::LeadingDimension`] on `ldo` (below `offs.len()` when `m > 1`);
    /// [`Error::SliceTooShort`] on `out` (fewer than `(m − 1) · ldo + offs.len()` values).
    #[allow(clippy::too_many_arguments)]
    pub fn offset_dot_rows(
        &self,
        m: usize,
        dy: &[f32],
        ldd: usize,
        runs: &Offsets,
        offs: &Offsets,
        x: &[f32],
        out: &mut [f32],
        ldo: usize,
    ) -> Result<(), Error> {
        if !(1..=DOT_MR).contains(&m) {
            return Err(shape("m", format!("1..={DOT_MR}"), m.to_string()));
        }
        let ncols = offs.len();
        if m > 1 && ldo < ncols {
            return Err(Error::LeadingDimension {
                arg: "ldo",
                value: ldo,
                min: ncols,
            });
        }
        let out_need = if ncols == 0 { 0 } else { (m - 1) * ldo + ncols };
        if out.len() < out_need {
            return Err(Error::SliceTooShort {
                arg: "out",
                len: out.len(),
                needed: out_need,
            });
        }
        let row = runs.len() * OFFSET_LANES;
        if m > 1 && ldd < row {
            return Err(Error::LeadingDimension {
                arg: "ldd",
                value: ldd,
                min: row,
            });
        }
        let needed = if row == 0 { 0 } else { (m - 1) * ldd + row };
        if dy.len() < needed {
            return Err(Error::SliceTooShort {
                arg: "dy",
                len: dy.len(),
                needed,
            });
        }
        if runs.is_empty() || ncols == 0 {
            // Every sum is empty: out += 0.
            return Ok(());
        }
        check_reach(runs.max, offs.max, x)?;
        let (r, dp) = (runs.as_slice(), dy.as_ptr());
        let mut acc: DotTile = Default::default();
        for j0 in (0..ncols).step_by(DOT_NC) {
            let nc = DOT_NC.min(ncols - j0);
            let mut ptrs = [x.as_ptr(); DOT_NC];
            for (p, &o) in ptrs.iter_mut().zip(&offs.offs[j0..j0 + nc]) {
                // `o <= offs.max < x.len()` (checked above): inside the slice.
                *p = x.as_ptr().wrapping_add(o);
            }
            // SAFETY: m in 1..=DOT_MR and nc in 1..=DOT_NC; dy row i, run r reads
            // dy[i·ldd + r·8 .. + 8] inside `needed` (checked); column j, run r reads
            // x[o_j + runs[r] .. + 8] with o_j + runs[r] + 8 <= offs.max + runs.max + 8 <=
            // x.len() (checked). Holding the family value proves its features.
            unsafe {
                match self.family {
                    Family::Scalar(k) => dot_any(k, m, nc, r, dp, ldd, &ptrs, &mut acc, false),
                    #[cfg(target_arch = "x86_64")]
                    Family::Avx2(k) => dot_any(k, m, nc, r, dp, ldd, &ptrs, &mut acc, false),
                    #[cfg(target_arch = "x86_64")]
                    Family::Avx512(k) => dot_any(k, m, nc, r, dp, ldd, &ptrs, &mut acc, false),
                }
            }
            for (i, a) in acc.iter().enumerate().take(m) {
                for (o, &v) in out[i * ldo + j0..][..nc].iter_mut().zip(a) {
                    *o += v;
                }
            }
        }
        Ok(())
    }
}

/// [`Gemm::offset_dot_rows`] with the process-wide kernel family.
#[allow(clippy::too_many_arguments)]
pub fn offset_dot_rows(
    m: usize,
    dy: &[f32],
    ldd: usize,
    runs: &Offsets,
    offs: &Offsets,
    x: &[f32],
    out: &mut [f32],
    ldo: usize,
) -> Result<(), Error> {
    Gemm::global()?.offset_dot_rows(m, dy, ldd, runs, offs, x, out, ldo)
}

/// [`Gemm::offset_a_tile`] with the process-wide kernel family.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn offset_a_tile(
    wt: &[f32],
    offs: &Offsets,
    steps: Range<usize>,
    x: &[f32],
    bases: &[usize],
    acc: &mut OffsetATile,
    accumulate: bool,
) -> Result<(), Error> {
    Gemm::global()?.offset_a_tile(wt, offs, steps, x, bases, acc, accumulate)
}

/// [`Gemm::offset_a_shape`] of the process-wide kernel family.
pub fn offset_a_shape() -> Result<(usize, usize), Error> {
    Ok(Gemm::global()?.offset_a_shape())
}

/// [`Gemm::offset_a_store`] with the process-wide kernel family.
#[allow(clippy::too_many_arguments)]
pub fn offset_a_store(
    wt: &[f32],
    offs: &Offsets,
    steps: Range<usize>,
    x: &[f32],
    bases: &[usize],
    y: &mut [f32],
    dst: &[usize],
    ldy: usize,
    channels: usize,
    store: OffsetAStore<'_>,
    relu: bool,
) -> Result<(), Error> {
    Gemm::global()?.offset_a_store(
        wt, offs, steps, x, bases, y, dst, ldy, channels, store, relu,
    )
}

/// [`Gemm::offset_tile`] with the process-wide kernel family.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn offset_tile(
    m: usize,
    w: &[f32],
    offs: &Offsets,
    steps: Range<usize>,
    x: &[f32],
    src: &[usize],
    acc: &mut OffsetTile,
    accumulate: bool,
) -> Result<(), Error> {
    Gemm::global()?.offset_tile(m, w, offs, steps, x, src, acc, accumulate)
}

/// [`Gemm::offset_wide_tile`] with the process-wide kernel family.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn offset_wide_tile(
    m: usize,
    w: &[f32],
    offs: &Offsets,
    steps: Range<usize>,
    x: &[f32],
    src: &[usize],
    acc: &mut WideTile,
    accumulate: bool,
) -> Result<(), Error> {
    Gemm::global()?.offset_wide_tile(m, w, offs, steps, x, src, acc, accumulate)
}

/// [`Gemm::offset_dot_tile`] with the process-wide kernel family.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn offset_dot_tile(
    m: usize,
    dy: &[f32],
    ldd: usize,
    runs: &Offsets,
    offs: &Offsets,
    cols: Range<usize>,
    x: &[f32],
    acc: &mut DotTile,
    accumulate: bool,
) -> Result<(), Error> {
    Gemm::global()?.offset_dot_tile(m, dy, ldd, runs, offs, cols, x, acc, accumulate)
}
