//! Masked row copies for conv-ops' im2col B packing: one call packs the rows of one kernel tap
//! (one row per input channel) of a micro-panel `16 · chunks` values wide, each 16-lane chunk
//! described once for all rows by a [`Chunk`]: one or two straight pieces read with masked
//! vector loads (stride 1 or 2 along the source; the lanes outside the masks, the padding, are
//! zero and never read), or a masked gather. conv-ops is built for baseline x86-64 (its copies
//! compile to SSE and its zero fills are per lane); these are runtime-dispatched like the
//! GEMM kernels: AVX-512 (masked `vmovups`, `vpermt2ps` for stride 2, `vgatherdps`), AVX2
//! (`vmaskmovps`, `vgatherdps`) and a portable loop.

use std::sync::OnceLock;

use crate::isa::Family;
use crate::{Error, Gemm, Isa};

/// Lanes of one [`Chunk`].
pub const CHUNK_LANES: usize = 16;

/// How the 16 lanes of one chunk of a panel row are read, relative to the row's source `s`
/// (a pointer; offsets may be negative).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunk {
    /// Lane `l` in `m1` reads `s[off1 + step · l]`, lane `l` in `m2` reads `s[off2 + step ·
    /// l]` (`m1 & m2 == 0`), every other lane is 0. `step` is 1 or 2.
    Lines {
        /// 1 or 2.
        step: u8,
        /// Lanes of the first piece (bit `l` = lane `l`).
        m1: u16,
        /// Lanes of the second piece.
        m2: u16,
        /// Offset of the first piece's lane 0 (read or not).
        off1: isize,
        /// Offset of the second piece's lane 0.
        off2: isize,
    },
    /// Lane `l` in `mask` reads `s[idx[at][l]]` (`idx` the table passed with the chunks), every
    /// other lane is 0.
    Gather {
        /// Lanes read.
        mask: u16,
        /// Row of the index table.
        at: u32,
    },
}

impl Chunk {
    /// Every lane zero.
    pub const ZERO: Chunk = Chunk::Lines {
        step: 1,
        m1: 0,
        m2: 0,
        off1: 0,
        off2: 0,
    };

    /// The chunk reading `offs[l]` for the lanes with `Some` (at most 16 lanes), as one or two
    /// pieces of `step` (1 or 2) if they are, else as a gather whose indices are appended to
    /// `idx`. `None` if a gather's offset does not fit an `i32`.
    pub fn from_offsets(
        offs: &[Option<isize>],
        step: usize,
        idx: &mut Vec<[i32; CHUNK_LANES]>,
    ) -> Option<Chunk> {
        debug_assert!(offs.len() <= CHUNK_LANES);
        if step == 1 || step == 2 {
            let s = step as isize;
            let (mut p1, mut p2) = (None::<isize>, None::<isize>);
            let (mut m1, mut m2) = (0u16, 0u16);
            let mut ok = true;
            for (l, o) in offs.iter().enumerate() {
                let Some(o) = *o else { continue };
                let base = o - s * l as isize;
                if *p1.get_or_insert(base) == base {
                    m1 |= 1 << l;
                } else if *p2.get_or_insert(base) == base {
                    m2 |= 1 << l;
                } else {
                    ok = false;
                    break;
                }
            }
            if ok {
                return Some(Chunk::Lines {
                    step: step as u8,
                    m1,
                    m2,
                    off1: p1.unwrap_or(0),
                    off2: p2.unwrap_or(0),
                });
            }
        }
        let mut row = [0i32; CHUNK_LANES];
        let mut mask = 0u16;
        for (l, o) in offs.iter().enumerate() {
            if let Some(o) = *o {
                row[l] = i32::try_from(o).ok()?;
                mask |= 1 << l;
            }
        }
        let at = u32::try_from(idx.len()).ok()?;
        idx.push(row);
        Some(Chunk::Gather { mask, at })
    }

    /// The offset lane `l` reads, `None` for a zero lane.
    fn lane(&self, l: usize, idx: &[[i32; CHUNK_LANES]]) -> Option<isize> {
        let bit = 1u16 << l;
        match *self {
            Chunk::Lines {
                step,
                m1,
                m2,
                off1,
                off2,
            } => {
                let t = step as isize * l as isize;
                if m1 & bit != 0 {
                    Some(off1 + t)
                } else if m2 & bit != 0 {
                    Some(off2 + t)
                } else {
                    None
                }
            }
            Chunk::Gather { mask, at } => (mask & bit != 0).then(|| idx[at as usize][l] as isize),
        }
    }
}

/// One panel of an im2col-like B described for the fused packing of the AVX-512 8×48 kernel
/// ([`crate::PackB::conv_panel`]), as the rows of im2col repeat: row `p` of the panel (`p <
/// kc`) is tap `t = (first + p) % period` of the view, whose `nch` chunks (panel width / 16)
/// are `taps[t · nch..][..nch]`, read from the source at the element offset `base + ((first +
/// p) / period) · step` (one channel plane further every `period` rows). The driver resolves
/// it (`ConvRows::resolve`, internal) and checks every offset the masks read against the source's
/// length before a kernel reads it.
#[derive(Clone, Debug, Default)]
pub struct ConvPanel {
    /// Per tap of the view, `nch` chunks, back to back.
    pub taps: Vec<Chunk>,
    /// Rows per channel (the taps of the view).
    pub period: usize,
    /// The view's tap of the panel's first row.
    pub first: usize,
    /// Element offset of the first row's channel plane in the source slice.
    pub base: isize,
    /// Elements from one channel plane to the next.
    pub step: isize,
}

/// One row of a resolved [`ConvPanel`] cycle, as the fused kernel reads it: chunk `q` of the
/// row is `maskz_load(m[q], src + off + 16·q)` (`off` in bytes; lanes outside the mask are zero
/// and never read), `src` advancing by [`ConvRows::step`] bytes after every `period` rows.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct ConvRow {
    /// Byte offset of the row's lane 0 from the cycle's source pointer.
    pub(crate) off: isize,
    /// Per 16-lane chunk, the lanes read.
    pub(crate) m: [u16; 3],
    /// Bytes past `off` of the line the fused tile prefetches into L2 for this row: [`PF_AHEAD`]
    /// and line `t mod 3` of the window (tap `t` of the view's period).
    pub(crate) pf: u16,
}

/// How far past a row's offset (bytes) the AVX-512 fused tile prefetches the row's window: two
/// 48-wide panels, where the same row of the panel after next reads on a stride-1 layer whose
/// output lines read consecutive input. Row `t` of a period prefetches line `t mod 3` of that
/// window ([`ConvRow::pf`]): the three taps of a 3-wide kernel row read one window a value
/// apart, so together they prefetch its three lines (its fourth, when the window is not
/// aligned, comes with the next panel's first). Only the leading window of each channel (its
/// last taps) reads lines that no earlier panel read, all three of them; sessions 22-38
/// prefetched the first line alone (every row at + 384 bytes) and left the others to the
/// hardware prefetchers, which in the Zen 5 host's slow phases did not keep up
/// (docs/PERFORMANCE.md, conv-ops, session 39).
const PF_AHEAD: u16 = 384;

/// One row of a resolved [`ConvPanel`] cycle whose chunks read every other value (step 2,
/// one or two pieces: im2col rows of a stride-2 layer, a piece per output line), as the fused
/// kernel reads it. Chunk `q`'s 16 lanes are the even lanes of a 32-value window: its low 16
/// values `maskz_load(m[4q], src + off[2q])` merged with `mask_load(m[4q + 2], src + off[2q +
/// 1])`, its high 16 the same at + 64 bytes with `m[4q + 1]`, `m[4q + 3]` (`off` in bytes; the
/// masks select only the window's even lanes that a piece reads, so lanes outside the pieces
/// are zero and never read; except that piece 1's window is read whole when its masks are
/// all ones, which [`ConvRows::resolve`] sets only when the pieces cover all 16 lanes and
/// the whole window lies inside the source).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct ConvRow2 {
    /// Per chunk, the byte offsets of its two pieces' lane 0.
    pub(crate) off: [isize; 6],
    /// Per chunk, the window's load masks: piece 1's low and high half, then piece 2's (the
    /// fused tile tests piece 2's two at once: one 32-bit half of the chunk's 64 bits).
    /// Piece 1's two are both `0xffff` when no lane of the chunk lies in the padding: the
    /// tile then reads its window with plain loads, whole (its odd lanes are dropped, piece
    /// 2's lanes merged over it).
    pub(crate) m: [u16; 12],
    /// Byte offset of the two cache lines the row prefetches (see [`PF2_BACK`]).
    pub(crate) pf: isize,
}

/// The row forms of a resolved [`ConvPanel`] cycle ([`ConvRow`], [`ConvRow2`]): what the
/// two-step fallback ([`super::conv_then_run`]) packs per lane, and the AVX-512 fused tile that
/// reads them ([`super::Kernel::run_packing_conv`]).
pub(crate) trait ConvRowForm: Copy {
    /// Lane `l` of chunk `q` of this row, its pieces read at their byte offsets from `s` (the
    /// source pointer of the row's period); 0 when no mask selects the lane.
    ///
    /// # Safety
    /// The lane, when a mask selects it, is readable at its piece's offset from `s`.
    unsafe fn lane(&self, s: *const f32, q: usize, l: usize) -> f32;

    /// The full `8 × 48` tile of `avx512-f32-8x48` that packs these rows as it runs.
    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE: super::skx_conv::FusedTile<Self>;
}

/// The value `s + off` bytes + `i` values (masked lanes only: never read otherwise).
///
/// # Safety
/// That value is readable.
#[inline(always)]
unsafe fn at(s: *const f32, off: isize, i: usize) -> f32 {
    // SAFETY: the caller's.
    unsafe { *s.cast::<u8>().wrapping_offset(off).cast::<f32>().add(i) }
}

impl ConvRowForm for ConvRow {
    #[inline(always)]
    unsafe fn lane(&self, s: *const f32, q: usize, l: usize) -> f32 {
        if self.m[q] & (1 << l) != 0 {
            // SAFETY: the lane is selected, hence readable (the caller's contract).
            unsafe { at(s, self.off, q * CHUNK_LANES + l) }
        } else {
            0.0
        }
    }

    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE: super::skx_conv::FusedTile<Self> = super::skx_conv::avx512_ukr_conv_asm;
}

impl ConvRowForm for ConvRow2 {
    #[inline(always)]
    unsafe fn lane(&self, s: *const f32, q: usize, l: usize) -> f32 {
        // Lane l is window lane 2l: half `l / 8`, bit `2l mod 16` of its masks.
        let (half, bit) = (l / 8, 1u16 << (2 * l % 16));
        // Piece 2 first: its loads merge over piece 1's (whose masks may select every lane).
        match (0..2)
            .rev()
            .find(|&i| self.m[4 * q + 2 * i + half] & bit != 0)
        {
            // SAFETY: the lane is selected in piece i, hence readable (the caller's contract).
            Some(i) => unsafe { at(s, self.off[2 * q + i], 2 * l) },
            None => 0.0,
        }
    }

    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE: super::skx_conv::FusedTile<Self> = super::skx_conv::avx512_ukr_conv2_asm;
}

/// The prefetch of a step-2 panel's rows: the panel's highest read position in a channel
/// plane is its frontier (the next panel reads on past it); the row of tap `t` of a channel's
/// period prefetches three cache lines (into L2: the panel's tiles between here and the next
/// panel stream more than L1 through) from `32·t` values past `PF2_BACK` values before the
/// frontier on (a period of 9 taps: the 288-304 values from 32 before the frontier, about the
/// 152-208 values the next 48 output positions of a 3×3 stride-2 layer on 56² move on in x).
const PF2_BACK: isize = 32;

/// A [`ConvPanel`] resolved for the fused kernel: `rows` (one `period` of rows, starting at
/// the panel's first row; or `rows2` when `strided`) and the byte step of the source pointer
/// per period.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConvRows {
    pub(crate) rows: Vec<ConvRow>,
    /// The rows of a step-2 panel ([`ConvRow2`]), when `strided`.
    pub(crate) rows2: Vec<ConvRow2>,
    /// Whether the panel resolved to step-2 rows (`rows2`) rather than `rows`.
    pub(crate) strided: bool,
    /// Bytes from one period of rows to the next.
    pub(crate) step: isize,
    /// The panels resolved before, without their bases (at most [`MEMOS`]; kept across
    /// products when the caller keeps this value, as the driver's per-thread workspace does).
    memos: Vec<Memo>,
    /// The memo whose rows `rows` / `rows2` hold (offsets at the last base resolved).
    last: Option<usize>,
    /// The memo a new panel replaces once there are [`MEMOS`].
    next: usize,
}

/// How many panel descriptions [`ConvRows`] keeps. The stride-2 forward of ResNet-50's
/// 128@56² layer resolves 16 full panels an image in each of 3 passes: 7 column phases (a
/// 48-wide panel moves 48 of 28-wide output lines) and the image's first line's panel, a
/// different first row per pass, so ~24 descriptions repeat over every image.
const MEMOS: usize = 64;

/// What [`ConvRows::resolve`] keeps of a panel it resolved: the panel's description (all but
/// its base) and block (with a hash of them, compared first), its rows' masks, each row's
/// element offset without the base, and the lowest and highest offset (without the base) any
/// row of the block reads. A panel that differs only by its base (the same taps over other
/// input lines: every full panel of a block of a 3×3 or 3×3×3 kernel's backward-filter B;
/// the forward's panels of the same column phase in every image) then needs only its base
/// added and two bounds checked, not every row resolved again.
#[derive(Clone, Debug)]
struct Memo {
    hash: u64,
    /// Whether the rows are [`ConvRow2`]s (`rows2`).
    strided: bool,
    /// Bytes from one period of rows to the next.
    bstep: isize,
    /// One period of rows, their offsets unset (`strided`: `rows2`).
    rows: Vec<ConvRow>,
    rows2: Vec<ConvRow2>,
    taps: Vec<Chunk>,
    period: usize,
    first: usize,
    step: isize,
    kc: usize,
    nch: usize,
    rel: Vec<isize>,
    /// Step-2 panels: per row, its chunks' pieces' element offsets without the base (`rel`
    /// is then empty).
    rel2: Vec<[isize; 7]>,
    /// `None` when no row reads anything.
    reads: Option<(isize, isize)>,
}

impl ConvRows {
    /// Resolves `p` for a kernel whose panels are `nch` chunks wide, for a block of `kc` rows
    /// read from a source of `len` values: `false` (the panel is then packed up front) unless
    /// every chunk is a step-1 line of one piece whose lanes continue the row's first piece
    /// (`off1` of chunk `q` = the row's offset + 16·q: im2col rows of stride-1 layers whose
    /// output lines read consecutive input), and every lane read lies inside `0..len`.
    pub(crate) fn resolve(&mut self, p: &ConvPanel, len: usize, kc: usize, nch: usize) -> bool {
        let hash = memo_hash(p, kc, nch);
        let same = |m: &Memo| {
            m.hash == hash
                && m.period == p.period
                && m.first == p.first
                && m.step == p.step
                && m.kc == kc
                && m.nch == nch
                && m.taps == p.taps
        };
        let found = match self.last {
            Some(i) if same(&self.memos[i]) => Some(i),
            _ => self.memos.iter().position(same),
        };
        let i = match found {
            Some(i) => {
                if self.last != Some(i) {
                    let m = &self.memos[i];
                    self.strided = m.strided;
                    self.step = m.bstep;
                    if m.strided {
                        self.rows2.clone_from(&m.rows2);
                    } else {
                        self.rows.clone_from(&m.rows);
                    }
                }
                i
            }
            None => {
                self.last = None;
                let mut memo = self.describe(p, kc, nch);
                self.strided = false;
                if memo.is_none() && (1..=3).contains(&nch) && period_ok(p, kc, nch) {
                    memo = self.describe2(p, kc, nch);
                    self.strided = memo.is_some();
                }
                let Some(mut m) = memo else {
                    return false;
                };
                m.hash = hash;
                m.strided = self.strided;
                m.bstep = self.step;
                if m.strided {
                    m.rows2.clone_from(&self.rows2);
                } else {
                    m.rows.clone_from(&self.rows);
                }
                if self.memos.len() < MEMOS {
                    self.memos.push(m);
                    self.memos.len() - 1
                } else {
                    let i = self.next;
                    self.next = (i + 1) % MEMOS;
                    self.memos[i] = m;
                    i
                }
            }
        };
        self.last = Some(i);
        let m = &self.memos[i];
        let Ok(len) = isize::try_from(len) else {
            return false;
        };
        if let Some((lo, hi)) = m.reads {
            match (lo.checked_add(p.base), hi.checked_add(p.base)) {
                (Some(l), Some(h)) if l >= 0 && h < len => {}
                _ => return false,
            }
        }
        let bytes = |rel: isize| rel.checked_add(p.base).and_then(|o| o.checked_mul(4));
        if self.strided {
            self.rows2.truncate(m.rel2.len());
            for (row, rel) in self.rows2.iter_mut().zip(&m.rel2) {
                for (o, &r) in row.off.iter_mut().chain([&mut row.pf]).zip(rel) {
                    match bytes(r) {
                        Some(b) => *o = b,
                        None => return false,
                    }
                }
            }
            return true;
        }
        self.rows.truncate(m.rel.len());
        for (row, &rel) in self.rows.iter_mut().zip(&m.rel) {
            match bytes(rel) {
                Some(b) => row.off = b,
                None => return false,
            }
        }
        true
    }

    /// [`ConvRows::describe`] for panels whose chunks all read with step 2 (one or two pieces
    /// each; chunks without lanes go with any step), their rows in `self.rows2`; `None` for
    /// any other panel or when an offset does not fit.
    fn describe2(&mut self, p: &ConvPanel, kc: usize, nch: usize) -> Option<Memo> {
        let (period, first) = (p.period, p.first);
        self.rows2.clear();
        let mut rel2 = Vec::with_capacity(period.min(kc));
        let mut reads: Option<(isize, isize)> = None;
        let mut frontier = isize::MIN;
        for j in 0..period.min(kc) {
            let t = (first + j) % period;
            let chan = ((first + j) / period) as isize;
            let cbase = chan.checked_mul(p.step)?;
            let mut row = ConvRow2::default();
            let mut rel = [cbase; 7];
            let (mut lo, mut hi) = (isize::MAX, isize::MIN);
            // The last value a whole window reads (beyond the lanes: not a frontier).
            let mut whole = isize::MIN;
            for (q, c) in p.taps[t * nch..][..nch].iter().enumerate() {
                let Chunk::Lines {
                    step,
                    m1,
                    m2,
                    off1,
                    off2,
                } = *c
                else {
                    return None;
                };
                if m1 | m2 == 0 {
                    continue;
                }
                if step != 2 {
                    return None;
                }
                for (i, (m, off)) in [(m1, off1), (m2, off2)].into_iter().enumerate() {
                    if m == 0 {
                        continue;
                    }
                    let o = cbase.checked_add(off)?;
                    rel[2 * q + i] = o;
                    row.m[4 * q + 2 * i] = spread(m);
                    row.m[4 * q + 2 * i + 1] = spread(m >> 8);
                    lo = lo.min(o.checked_add(2 * m.trailing_zeros() as isize)?);
                    hi = hi.max(o.checked_add(2 * (15 - m.leading_zeros() as isize))?);
                }
                // No lane in the padding (piece 1 from lane 0, piece 2 after it): piece 1's
                // window is read whole, without masks (the tile's plain loads; piece 2 merges
                // over it, the odd lanes are dropped), so its 32 values must lie in the source.
                if m1 | m2 == u16::MAX && m1 & 1 == 1 {
                    row.m[4 * q] = u16::MAX;
                    row.m[4 * q + 1] = u16::MAX;
                    let o = rel[2 * q];
                    lo = lo.min(o);
                    whole = whole.max(o.checked_add(31)?);
                }
            }
            if lo <= hi {
                frontier = frontier.max(hi - cbase);
                let hi = hi.max(whole);
                let cycles = ((kc - 1 - j) / period) as isize;
                let last = cycles.checked_mul(p.step).and_then(|d| d.checked_add(hi))?;
                reads = Some(match reads {
                    None => (lo, last),
                    Some((l, h)) => (l.min(lo), h.max(last)),
                });
            }
            rel2.push(rel);
            self.rows2.push(row);
        }
        // The prefetch lines (a prefetch never faults: no bounds to check).
        if frontier > isize::MIN {
            for (j, rel) in rel2.iter_mut().enumerate() {
                let t = ((first + j) % period) as isize;
                let chan = ((first + j) / period) as isize;
                rel[6] = (chan * p.step + frontier - PF2_BACK).checked_add(32 * t)?;
            }
        }
        self.step = p.step.checked_mul(4)?;
        Some(Memo {
            hash: 0,
            strided: false,
            bstep: 0,
            rows: Vec::new(),
            rows2: Vec::new(),
            taps: p.taps.clone(),
            period,
            first,
            step: p.step,
            kc,
            nch,
            rel: Vec::new(),
            rel2,
            reads,
        })
    }

    /// The [`Memo`] of `p` for a block of `kc` rows and panels of `nch` chunks, with its rows
    /// (masks; offsets set by the caller) in `self.rows` and the byte step in `self.step`;
    /// `None` unless every chunk is a step-1 line of one piece continuing its row (see
    /// [`ConvRows::resolve`]) and every offset fits.
    fn describe(&mut self, p: &ConvPanel, kc: usize, nch: usize) -> Option<Memo> {
        let (period, first) = (p.period, p.first);
        if nch == 0
            || nch > 3
            || period == 0
            || first >= period
            || p.taps.len() != period * nch
            || p.step < 0
            || kc == 0
        {
            return None;
        }
        self.rows.clear();
        let mut rel = Vec::with_capacity(period.min(kc));
        let mut reads: Option<(isize, isize)> = None;
        for j in 0..period.min(kc) {
            let t = (first + j) % period;
            let chan = ((first + j) / period) as isize;
            let mut row = ConvRow {
                pf: PF_AHEAD + 64 * (t % 3) as u16,
                ..ConvRow::default()
            };
            let mut at: Option<isize> = None;
            let (mut lo, mut hi) = (isize::MAX, isize::MIN);
            for (q, c) in p.taps[t * nch..][..nch].iter().enumerate() {
                let Chunk::Lines {
                    step: 1,
                    m1,
                    m2: 0,
                    off1,
                    ..
                } = *c
                else {
                    return None;
                };
                if m1 == 0 {
                    continue;
                }
                let q16 = 16 * q as isize;
                let o = off1.checked_sub(q16)?;
                if *at.get_or_insert(o) != o {
                    return None;
                }
                row.m[q] = m1;
                lo = lo.min(q16 + m1.trailing_zeros() as isize);
                hi = hi.max(q16 + 15 - m1.leading_zeros() as isize);
            }
            // Element offset of the row's lane 0 from the source, without the base.
            let off = chan
                .checked_mul(p.step)
                .and_then(|c| c.checked_add(at.unwrap_or(0)))?;
            if at.is_some() {
                // The rows of this entry: j, j + period, ... below kc.
                let cycles = ((kc - 1 - j) / period) as isize;
                let last = cycles
                    .checked_mul(p.step)
                    .and_then(|d| d.checked_add(off))
                    .and_then(|o| o.checked_add(hi))?;
                let first_read = off.checked_add(lo)?;
                reads = Some(match reads {
                    None => (first_read, last),
                    Some((l, h)) => (l.min(first_read), h.max(last)),
                });
            }
            rel.push(off);
            self.rows.push(row);
        }
        self.step = p.step.checked_mul(4)?;
        Some(Memo {
            hash: 0,
            strided: false,
            bstep: 0,
            rows: Vec::new(),
            rows2: Vec::new(),
            taps: p.taps.clone(),
            period,
            first,
            step: p.step,
            kc,
            nch,
            rel,
            rel2: Vec::new(),
            reads,
        })
    }
}

/// A hash of `p` without its base, for a block of `kc` rows and panels of `nch` chunks: its
/// shape and each tap's first chunk (the key of a [`Memo`], compared before the description
/// itself, so a collision only costs that comparison).
fn memo_hash(p: &ConvPanel, kc: usize, nch: usize) -> u64 {
    let mix = |h: u64, v: u64| (h.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    let h = [p.period, p.first, kc, nch, p.taps.len()]
        .into_iter()
        .fold(p.step as u64, |h, v| mix(h, v as u64));
    p.taps.iter().step_by(nch.max(1)).fold(h, |h, c| match *c {
        Chunk::Lines { m1, m2, off1, .. } => {
            mix(h, (off1 as u64) << 32 ^ u64::from(m1) << 16 ^ u64::from(m2))
        }
        Chunk::Gather { mask, at } => mix(h, 1 << 63 | u64::from(mask) << 32 | u64::from(at)),
    })
}

/// The shape checks of [`ConvRows::describe`]: a period of `nch` chunks per tap, the first row
/// inside it, a non-negative step, at least one row.
fn period_ok(p: &ConvPanel, kc: usize, nch: usize) -> bool {
    p.period != 0 && p.first < p.period && p.taps.len() == p.period * nch && p.step >= 0 && kc != 0
}

/// `(dst, dst_step, rows, src, src_step, chunks, idx)`: the contract of [`ConvPack::pack_rows`].
type PackRows = unsafe fn(*mut f32, usize, usize, *const f32, usize, &[Chunk], &[[i32; 16]]);

/// `(dst, ld, rows, src, lanes, chunks, per_block, idx)`: the contract of
/// [`ConvPack::pack_transposed`].
type PackTransposed = unsafe fn(
    *mut f32,
    usize,
    usize,
    *const f32,
    &[(isize, u32)],
    &[Chunk],
    usize,
    &[[i32; CHUNK_LANES]],
);

/// The signature of [`ConvPack::interleave_rows`]'s bodies.
type Interleave = unsafe fn(*mut f32, usize, *const f32, *const f32, usize, usize, usize);

/// The signature of [`ConvPack::interleave_lines`]'s bodies.
type InterleaveLines = unsafe fn(*mut f32, usize, [*const f32; 4], usize, usize, usize, bool);

/// The signature of [`ConvPack::deinterleave_lines`]'s bodies.
type Deinterleave = unsafe fn(&[*mut f32], usize, *const f32, usize, usize, usize);

/// The masked row copies of one kernel family.
#[derive(Clone, Copy)]
pub struct ConvPack {
    isa: Isa,
    f: PackRows,
    t: PackTransposed,
    i: Interleave,
    l: InterleaveLines,
    d: Deinterleave,
}

impl std::fmt::Debug for ConvPack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConvPack").field("isa", &self.isa).finish()
    }
}

static SCALAR: ConvPack = ConvPack {
    isa: Isa::Scalar,
    f: scalar_rows,
    t: scalar_transposed,
    i: scalar_interleave,
    l: scalar_interleave_lines,
    d: scalar_deinterleave,
};
#[cfg(target_arch = "x86_64")]
static AVX2: ConvPack = ConvPack {
    isa: Isa::Avx2,
    f: avx2_rows,
    t: avx2_transposed,
    i: avx2_interleave,
    l: avx2_interleave_lines,
    d: avx2_deinterleave,
};
#[cfg(target_arch = "x86_64")]
static AVX512: ConvPack = ConvPack {
    isa: Isa::Avx512,
    f: avx512_rows,
    t: avx512_transposed,
    i: avx512_interleave,
    l: avx512_interleave_lines,
    d: avx512_deinterleave,
};

impl ConvPack {
    /// The copies of `isa`; errors if the CPU lacks the family.
    pub fn new(isa: Isa) -> Result<&'static ConvPack, Error> {
        Ok(match Family::require(isa)? {
            Family::Scalar(_) => &SCALAR,
            #[cfg(target_arch = "x86_64")]
            Family::Avx2(_) => &AVX2,
            #[cfg(target_arch = "x86_64")]
            Family::Avx512(_) => &AVX512,
        })
    }

    /// The copies of the process-wide GEMM's family (`CORE_BLAS_ISA` or the best available).
    pub fn global() -> Result<&'static ConvPack, Error> {
        static GLOBAL: OnceLock<Result<&'static ConvPack, Error>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| ConvPack::new(Gemm::global()?.isa()))
            .clone()
    }

    /// The family.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// For each row `i < rows` and chunk `q`: `dst[i·dst_step + 16q + l]` = the value lane `l`
    /// of `chunks[q]` reads from the row's source `src + i·src_step` (0 for a lane outside its
    /// masks).
    ///
    /// # Safety
    /// For every row `i < rows`: `dst + i·dst_step` is valid for `16 · chunks.len()` writes
    /// and does not overlap any source value read; for every lane `l` a chunk reads (in its
    /// masks), `src + i·src_step + offset(l)` is valid for one read. Lanes outside the masks are
    /// never read, so their addresses (computed with wrapping arithmetic) may lie anywhere.
    /// Every `Gather`'s `at < idx.len()`.
    #[inline]
    pub unsafe fn pack_rows(
        &self,
        dst: *mut f32,
        dst_step: usize,
        rows: usize,
        src: *const f32,
        src_step: usize,
        chunks: &[Chunk],
        idx: &[[i32; CHUNK_LANES]],
    ) {
        // SAFETY: the caller's contract; the table is only handed out when the CPU has the
        // family's features.
        unsafe { (self.f)(dst, dst_step, rows, src, src_step, chunks, idx) }
    }

    /// The transposed packing (a B operand whose rows are the chunks' lanes): for every row
    /// `p < rows` and column `j < ld`, `dst[p·ld + j]` = the value lane `p % 16` of chunk
    /// `chunks[(p / 16)·per_block + lanes[j].1]` reads from `src + lanes[j].0`, or 0 for `j >=
    /// lanes.len()`. Blocks of 16 rows × 16 columns are loaded as 16 chunks and transposed in
    /// registers (AVX-512; 8 × 8 on AVX2).
    ///
    /// # Safety
    /// `ld` is a multiple of 16 with `lanes.len() <= ld`; `dst` is valid for `rows · ld`
    /// writes not overlapping the source; every chunk index above is inside `chunks` for `p <
    /// 16·⌈rows / 16⌉` (whole blocks are loaded); for every lane a chunk reads (in its masks),
    /// `src + lanes[j].0 + offset(l)` is valid for one read (lanes outside the masks are never
    /// read); every `Gather`'s `at < idx.len()`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn pack_transposed(
        &self,
        dst: *mut f32,
        ld: usize,
        rows: usize,
        src: *const f32,
        lanes: &[(isize, u32)],
        chunks: &[Chunk],
        per_block: usize,
        idx: &[[i32; CHUNK_LANES]],
    ) {
        debug_assert!(ld.is_multiple_of(CHUNK_LANES) && lanes.len() <= ld);
        // SAFETY: the caller's contract; the table is only handed out when the CPU has the
        // family's features.
        unsafe { (self.t)(dst, ld, rows, src, lanes, chunks, per_block, idx) }
    }
}

impl ConvPack {
    /// For each row `r < rows`: `dst[r·dst_step + 2q] = lo[r·src_step + q]` and `dst[r·dst_step
    /// + 2q + 1] = hi[r·src_step + q]` for `q < len` (two lines of `len` values interleaved into
    /// one of `2·len`: the two column phases of a stride-2 backward-data). conv-ops is built for
    /// baseline x86-64, where this loop is 8-byte loads and 16-byte stores; here it is
    /// `vpermt2ps` and 64-byte stores (AVX-512) or 32-byte ones (AVX2).
    ///
    /// # Safety
    /// For every `r < rows`: `dst + r·dst_step` is valid for `2·len` writes, `lo + r·src_step`
    /// and `hi + r·src_step` for `len` reads, and the writes overlap none of the reads.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn interleave_rows(
        &self,
        dst: *mut f32,
        dst_step: usize,
        lo: *const f32,
        hi: *const f32,
        src_step: usize,
        rows: usize,
        len: usize,
    ) {
        // SAFETY: the caller's contract; the table is only handed out when the CPU has the
        // family's features.
        unsafe { (self.i)(dst, dst_step, lo, hi, src_step, rows, len) }
    }
}

impl ConvPack {
    /// Two [`ConvPack::interleave_rows`] of consecutive output lines at once: for each row `r <
    /// rows` and `q < len`, `dst[r·dst_step + 2q] = src[0][r·src_step + q]`, `dst[r·dst_step +
    /// 2q + 1] = src[1][..]`, `dst[r·dst_step + 2·len + 2q] = src[2][..]` and `dst[r·dst_step +
    /// 2·len + 2q + 1] = src[3][..]` (a stride-2 backward-data's four phases filling an even and
    /// the odd dx line after it, `4·len` values a row). The AVX-512 body assembles each row's
    /// values into the 64-byte-aligned vectors of the destination (whole cache lines, no
    /// line-crossing or masked stores inside the row) when `len` is a multiple of 4; `stream`
    /// (the destination is large and not read again soon) writes those whole lines with
    /// non-temporal stores, which skip the read for ownership of a line about to be overwritten,
    /// and fences them before returning.
    ///
    /// # Safety
    /// For every `r < rows`: `dst + r·dst_step` is valid for `4·len` writes, each `src[i] +
    /// r·src_step` for `len` reads, and the writes overlap none of the reads.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn interleave_lines(
        &self,
        dst: *mut f32,
        dst_step: usize,
        src: [*const f32; 4],
        src_step: usize,
        rows: usize,
        len: usize,
        stream: bool,
    ) {
        // SAFETY: the caller's contract; the table is only handed out when the CPU has the
        // family's features.
        unsafe { (self.l)(dst, dst_step, src, src_step, rows, len, stream) }
    }
}

impl ConvPack {
    /// The inverse of [`ConvPack::interleave_rows`] / [`ConvPack::interleave_lines`]: each row
    /// `r < rows` is `dst.len() / 2` consecutive lines of `2·len` values (line `l` from `src +
    /// r·src_step + 2·len·l`), each split into its two column phases: for `q < len`,
    /// `dst[2l][r·dst_step + q] = line[2q]` and `dst[2l + 1][r·dst_step + q] = line[2q + 1]` (the
    /// input of a stride-2 layer copied into its phases; two lines a row take an even and the
    /// odd input line after it in one pass, so the source is read in order, every cache line
    /// whole). conv-ops is built for baseline x86-64; here it is two 64-byte loads, two
    /// `vpermt2ps` and two stores per 16 values of each phase (AVX-512, the tail masked) or
    /// `vshufps` and a lane permute per 8 (AVX2).
    ///
    /// # Safety
    /// `dst.len()` is even; for every `r < rows`: `src + r·src_step` is valid for `dst.len() ·
    /// len` reads, each `dst[i] + r·dst_step` for `len` writes, and no write overlaps a read or
    /// another write.
    #[inline]
    pub unsafe fn deinterleave_lines(
        &self,
        dst: &[*mut f32],
        dst_step: usize,
        src: *const f32,
        src_step: usize,
        rows: usize,
        len: usize,
    ) {
        debug_assert!(dst.len().is_multiple_of(2));
        // SAFETY: the caller's contract; the table is only handed out when the CPU has the
        // family's features.
        unsafe { (self.d)(dst, dst_step, src, src_step, rows, len) }
    }
}

/// The portable deinterleave.
unsafe fn scalar_deinterleave(
    dst: &[*mut f32],
    dst_step: usize,
    src: *const f32,
    src_step: usize,
    rows: usize,
    len: usize,
) {
    for r in 0..rows {
        for (l, pair) in dst.chunks_exact(2).enumerate() {
            for q in 0..len {
                // SAFETY: the caller's contract (row r's `dst.len()·len` reads, `len` writes
                // of each phase).
                unsafe {
                    let s = src.add(r * src_step + 2 * len * l + 2 * q);
                    *pair[0].add(r * dst_step + q) = *s;
                    *pair[1].add(r * dst_step + q) = *s.add(1);
                }
            }
        }
    }
}

/// The AVX2 deinterleave: per 8 values of each phase, two loads, `vshufps` (the even and the
/// odd values of each 128-bit half) and `vpermpd` (the halves in order); the last 8 of a line
/// of 8 or more overlap the previous ones, shorter lines are copied value by value.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_deinterleave(
    dst: &[*mut f32],
    dst_step: usize,
    src: *const f32,
    src_step: usize,
    rows: usize,
    len: usize,
) {
    for r in 0..rows {
        for (l, pair) in dst.chunks_exact(2).enumerate() {
            // SAFETY: the caller's contract: the line's `2·len` reads and `len` writes of each
            // phase; a step at q (q + 8 <= len) reads `2q .. 2q + 16 <= 2·len` of the line and
            // writes `q .. q + 8`.
            unsafe {
                let (s, a, b) = (
                    src.add(r * src_step + 2 * len * l),
                    pair[0].add(r * dst_step),
                    pair[1].add(r * dst_step),
                );
                if len < 8 {
                    for q in 0..len {
                        *a.add(q) = *s.add(2 * q);
                        *b.add(q) = *s.add(2 * q + 1);
                    }
                    continue;
                }
                let step = |q: usize| {
                    let x = _mm256_loadu_ps(s.add(2 * q));
                    let y = _mm256_loadu_ps(s.add(2 * q + 8));
                    let order = |v: __m256| {
                        _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(v)))
                    };
                    _mm256_storeu_ps(a.add(q), order(_mm256_shuffle_ps::<0x88>(x, y)));
                    _mm256_storeu_ps(b.add(q), order(_mm256_shuffle_ps::<0xDD>(x, y)));
                };
                let mut q = 0;
                while q + 8 <= len {
                    step(q);
                    q += 8;
                }
                if q < len {
                    step(len - 8);
                }
            }
        }
    }
}

/// The lane masks of a tail of `tail` (< 16) values of each of two phases: the `tail` lanes of
/// one phase's vector, and the `2·tail` lanes of the interleaved line split over its two
/// vectors (the first's, then the second's).
#[cfg(target_arch = "x86_64")]
fn tail_masks(tail: usize) -> (u16, u16, u16) {
    debug_assert!(tail < CHUNK_LANES);
    (
        ((1u32 << tail) - 1) as u16,
        ((1u32 << (2 * tail).min(16)) - 1) as u16,
        ((1u32 << (2 * tail).saturating_sub(16)) - 1) as u16,
    )
}

/// The AVX-512 deinterleave: per 16 values of each phase, two loads and two `vpermt2ps`; the
/// tail's loads and stores masked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_deinterleave(
    dst: &[*mut f32],
    dst_step: usize,
    src: *const f32,
    src_step: usize,
    rows: usize,
    len: usize,
) {
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let tail = len % CHUNK_LANES;
    let (m_out, m_x, m_y) = tail_masks(tail);
    for r in 0..rows {
        for (l, pair) in dst.chunks_exact(2).enumerate() {
            // SAFETY: the caller's contract: the line's `2·len` reads and `len` writes of each
            // phase; whole steps stay below `len`, the tail's masked loads and stores touch only
            // lanes below `2·len` and `len` (masked-off lanes are not accessed).
            unsafe {
                let (s, a, b) = (
                    src.add(r * src_step + 2 * len * l),
                    pair[0].add(r * dst_step),
                    pair[1].add(r * dst_step),
                );
                let mut q = 0;
                while q + CHUNK_LANES <= len {
                    let x = _mm512_loadu_ps(s.add(2 * q));
                    let y = _mm512_loadu_ps(s.add(2 * q + 16));
                    _mm512_storeu_ps(a.add(q), _mm512_permutex2var_ps(x, even, y));
                    _mm512_storeu_ps(b.add(q), _mm512_permutex2var_ps(x, odd, y));
                    q += CHUNK_LANES;
                }
                if tail > 0 {
                    let x = _mm512_maskz_loadu_ps(m_x, s.add(2 * q));
                    let y = _mm512_maskz_loadu_ps(m_y, s.add(2 * q + 16));
                    _mm512_mask_storeu_ps(a.add(q), m_out, _mm512_permutex2var_ps(x, even, y));
                    _mm512_mask_storeu_ps(b.add(q), m_out, _mm512_permutex2var_ps(x, odd, y));
                }
            }
        }
    }
}

/// The portable two-line interleave: two [`scalar_interleave`]s.
#[allow(clippy::too_many_arguments)]
unsafe fn scalar_interleave_lines(
    dst: *mut f32,
    dst_step: usize,
    src: [*const f32; 4],
    src_step: usize,
    rows: usize,
    len: usize,
    _stream: bool,
) {
    // SAFETY: the caller's contract: row r's first `2·len` writes from `dst`, the next `2·len`
    // from `dst + 2·len`.
    unsafe {
        scalar_interleave(dst, dst_step, src[0], src[1], src_step, rows, len);
        scalar_interleave(
            dst.add(2 * len),
            dst_step,
            src[2],
            src[3],
            src_step,
            rows,
            len,
        );
    }
}

/// The AVX2 two-line interleave: two [`avx2_interleave`]s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_interleave_lines(
    dst: *mut f32,
    dst_step: usize,
    src: [*const f32; 4],
    src_step: usize,
    rows: usize,
    len: usize,
    _stream: bool,
) {
    // SAFETY: as in `scalar_interleave_lines`.
    unsafe {
        avx2_interleave(dst, dst_step, src[0], src[1], src_step, rows, len);
        avx2_interleave(
            dst.add(2 * len),
            dst_step,
            src[2],
            src[3],
            src_step,
            rows,
            len,
        );
    }
}

/// The AVX-512 two-line interleave. A row's `4·len` values (`len` a multiple of 4) are made 16
/// at a time in their order (one `vpermt2ps` of 8 values of each source, or of 4 values of
/// each of the four where the first line ends mid-vector) and shifted into the destination's
/// aligned vectors by the row's misalignment (a `vpermt2ps` across two consecutive ones); the
/// first and last aligned vectors, shared with other data when the row is misaligned, are
/// masked plain stores, the others whole-line stores (non-temporal with `stream`). Other
/// lengths: two [`avx512_interleave`]s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx512_interleave_lines(
    dst: *mut f32,
    dst_step: usize,
    src: [*const f32; 4],
    src_step: usize,
    rows: usize,
    len: usize,
    stream: bool,
) {
    if len == 0 || !len.is_multiple_of(4) {
        // SAFETY: as in `scalar_interleave_lines`.
        unsafe {
            avx512_interleave(dst, dst_step, src[0], src[1], src_step, rows, len);
            avx512_interleave(
                dst.add(2 * len),
                dst_step,
                src[2],
                src[3],
                src_step,
                rows,
                len,
            );
        }
        return;
    }
    // Lanes 0-7 of two vectors interleaved.
    let inter = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let (eights, half) = (len / 8, len % 8 == 4);
    for r in 0..rows {
        // SAFETY: the caller's contract: row r's `4·len` writes from `d` and `len` reads of
        // each source. Loads: 8 values at q + 8 <= len, 4 at q + 4 <= len. Stores: the aligned
        // vectors covering `d .. d + 4·len`; the first and last are masked to the lanes inside
        // it (masked-off lanes are not accessed), the others lie inside it.
        unsafe {
            let d = dst.add(r * dst_step);
            let s = src.map(|p| p.add(r * src_step));
            let m = (d as usize / 4) % 16;
            // Aligned vector j = lanes 16 - m.. of chunk j - 1, then lanes ..16 - m of chunk j.
            let idx = _mm512_add_epi32(iota, _mm512_set1_epi32(16 - m as i32));
            let base = d.wrapping_sub(m);
            let mut prev = _mm512_setzero_ps();
            let mut j = 0;
            let mut emit = |cur: __m512| {
                let v = _mm512_permutex2var_ps(prev, idx, cur);
                let p = base.wrapping_add(16 * j);
                if j == 0 && m > 0 {
                    _mm512_mask_storeu_ps(p, (0xffffu32 << m) as u16, v);
                } else if stream {
                    _mm512_stream_ps(p, v);
                } else {
                    _mm512_store_ps(p, v);
                }
                prev = cur;
                j += 1;
            };
            let eight = |a: *const f32, b: *const f32| {
                _mm512_permutex2var_ps(
                    _mm512_castps256_ps512(_mm256_loadu_ps(a)),
                    inter,
                    _mm512_castps256_ps512(_mm256_loadu_ps(b)),
                )
            };
            for q in 0..eights {
                emit(eight(s[0].add(8 * q), s[1].add(8 * q)));
            }
            let from = if half {
                // The first line's last 4 values of each source, then the second line's first 4.
                let pair = |a: *const f32, b: *const f32| {
                    _mm512_insertf32x4::<1>(
                        _mm512_castps128_ps512(_mm_loadu_ps(a)),
                        _mm_loadu_ps(b),
                    )
                };
                let x = pair(s[0].add(len - 4), s[2]);
                let y = pair(s[1].add(len - 4), s[3]);
                emit(_mm512_permutex2var_ps(x, inter, y));
                4
            } else {
                0
            };
            for q in 0..eights {
                emit(eight(s[2].add(from + 8 * q), s[3].add(from + 8 * q)));
            }
            if m > 0 {
                // The last aligned vector: chunk j - 1's last m lanes.
                let v = _mm512_permutex2var_ps(prev, idx, _mm512_setzero_ps());
                _mm512_mask_storeu_ps(base.wrapping_add(16 * j), ((1u32 << m) - 1) as u16, v);
            }
        }
    }
    if stream {
        _mm_sfence();
    }
}

/// The portable interleave.
#[allow(clippy::too_many_arguments)]
unsafe fn scalar_interleave(
    dst: *mut f32,
    dst_step: usize,
    lo: *const f32,
    hi: *const f32,
    src_step: usize,
    rows: usize,
    len: usize,
) {
    for r in 0..rows {
        for q in 0..len {
            // SAFETY: the caller's contract (row r's `2·len` writes, `len` reads of each line).
            unsafe {
                *dst.add(r * dst_step + 2 * q) = *lo.add(r * src_step + q);
                *dst.add(r * dst_step + 2 * q + 1) = *hi.add(r * src_step + q);
            }
        }
    }
}

/// The AVX2 interleave: `vunpcklps` / `vunpckhps` and a lane swap, 16 values per step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_interleave(
    dst: *mut f32,
    dst_step: usize,
    lo: *const f32,
    hi: *const f32,
    src_step: usize,
    rows: usize,
    len: usize,
) {
    for r in 0..rows {
        // SAFETY: the caller's contract: row r's `2·len` writes and `len` reads of each line;
        // the vector steps stay below `len` (the rest is copied value by value).
        unsafe {
            let (d, a, b) = (
                dst.add(r * dst_step),
                lo.add(r * src_step),
                hi.add(r * src_step),
            );
            let mut q = 0;
            while q + 8 <= len {
                let (x, y) = (_mm256_loadu_ps(a.add(q)), _mm256_loadu_ps(b.add(q)));
                let (l, h) = (_mm256_unpacklo_ps(x, y), _mm256_unpackhi_ps(x, y));
                _mm256_storeu_ps(d.add(2 * q), _mm256_permute2f128_ps(l, h, 0x20));
                _mm256_storeu_ps(d.add(2 * q + 8), _mm256_permute2f128_ps(l, h, 0x31));
                q += 8;
            }
            while q < len {
                *d.add(2 * q) = *a.add(q);
                *d.add(2 * q + 1) = *b.add(q);
                q += 1;
            }
        }
    }
}

/// The AVX-512 interleave: two `vpermt2ps` per 16 values, the tail masked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx512_interleave(
    dst: *mut f32,
    dst_step: usize,
    lo: *const f32,
    hi: *const f32,
    src_step: usize,
    rows: usize,
    len: usize,
) {
    let first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    let tail = len % CHUNK_LANES;
    let (m_in, m_lo, m_hi) = tail_masks(tail);
    for r in 0..rows {
        // SAFETY: the caller's contract: row r's `2·len` writes and `len` reads of each line;
        // whole steps stay below `len`, the tail's masked loads and stores touch only lanes
        // below it.
        unsafe {
            let (d, a, b) = (
                dst.add(r * dst_step),
                lo.add(r * src_step),
                hi.add(r * src_step),
            );
            let mut q = 0;
            while q + CHUNK_LANES <= len {
                let (x, y) = (_mm512_loadu_ps(a.add(q)), _mm512_loadu_ps(b.add(q)));
                _mm512_storeu_ps(d.add(2 * q), _mm512_permutex2var_ps(x, first, y));
                _mm512_storeu_ps(d.add(2 * q + 16), _mm512_permutex2var_ps(x, second, y));
                q += CHUNK_LANES;
            }
            if tail > 0 {
                let x = _mm512_maskz_loadu_ps(m_in, a.add(q));
                let y = _mm512_maskz_loadu_ps(m_in, b.add(q));
                _mm512_mask_storeu_ps(d.add(2 * q), m_lo, _mm512_permutex2var_ps(x, first, y));
                _mm512_mask_storeu_ps(
                    d.add(2 * q + 16),
                    m_hi,
                    _mm512_permutex2var_ps(x, second, y),
                );
            }
        }
    }
}

/// The portable transposed body.
#[allow(clippy::too_many_arguments)]
unsafe fn scalar_transposed(
    dst: *mut f32,
    ld: usize,
    rows: usize,
    src: *const f32,
    lanes: &[(isize, u32)],
    chunks: &[Chunk],
    per_block: usize,
    idx: &[[i32; CHUNK_LANES]],
) {
    for p in 0..rows {
        for j in 0..ld {
            let v = lanes.get(j).and_then(|&(off, tap)| {
                let c = chunks[(p / CHUNK_LANES) * per_block + tap as usize];
                c.lane(p % CHUNK_LANES, idx).map(|o| {
                    // SAFETY: the caller's contract: the lanes read are valid.
                    unsafe { *src.wrapping_offset(off).wrapping_offset(o) }
                })
            });
            // SAFETY: `p < rows`, `j < ld`: inside dst.
            unsafe { *dst.add(p * ld + j) = v.unwrap_or(0.0) };
        }
    }
}

/// The portable body.
unsafe fn scalar_rows(
    dst: *mut f32,
    dst_step: usize,
    rows: usize,
    src: *const f32,
    src_step: usize,
    chunks: &[Chunk],
    idx: &[[i32; CHUNK_LANES]],
) {
    for (q, c) in chunks.iter().enumerate() {
        for i in 0..rows {
            for l in 0..CHUNK_LANES {
                // SAFETY: the caller's contract: the lanes read are valid, the row's writes too.
                unsafe {
                    let v = match c.lane(l, idx) {
                        Some(o) => *src.wrapping_add(i * src_step).wrapping_offset(o),
                        None => 0.0,
                    };
                    *dst.add(i * dst_step + q * CHUNK_LANES + l) = v;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

/// Bits `l` of `m` (8 bits) moved to bits `2l`.
#[inline(always)]
fn spread(m: u16) -> u16 {
    let mut x = m & 0xff;
    x = (x | (x << 4)) & 0x0f0f;
    x = (x | (x << 2)) & 0x3333;
    (x | (x << 1)) & 0x5555
}

/// The AVX-512 body: chunk by chunk (its masks and permutation set up once), row by row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_rows(
    dst: *mut f32,
    dst_step: usize,
    rows: usize,
    src: *const f32,
    src_step: usize,
    chunks: &[Chunk],
    idx: &[[i32; CHUNK_LANES]],
) {
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (q, c) in chunks.iter().enumerate() {
        let d0 = dst.wrapping_add(q * CHUNK_LANES);
        match *c {
            Chunk::Lines {
                step: 1,
                m1,
                m2,
                off1,
                off2,
            } => {
                let (mut s1, mut s2) = (src.wrapping_offset(off1), src.wrapping_offset(off2));
                for i in 0..rows {
                    // SAFETY: masked loads read only the lanes of `m1` / `m2` (valid by the
                    // contract; masked lanes do not fault); the store is the row's chunk.
                    unsafe {
                        let mut v = _mm512_maskz_loadu_ps(m1, s1);
                        if m2 != 0 {
                            v = _mm512_mask_loadu_ps(v, m2, s2);
                        }
                        _mm512_storeu_ps(d0.add(i * dst_step), v);
                    }
                    s1 = s1.wrapping_add(src_step);
                    s2 = s2.wrapping_add(src_step);
                }
            }
            Chunk::Lines {
                step: 2,
                m1,
                m2,
                off1,
                off2,
            } => {
                // Step 2: lane l reads off + 2l, i.e. the even lanes of two 16-value loads.
                let (l1, h1, l2, h2) = (spread(m1), spread(m1 >> 8), spread(m2), spread(m2 >> 8));
                let (mut s1, mut s2) = (src.wrapping_offset(off1), src.wrapping_offset(off2));
                for i in 0..rows {
                    // SAFETY: as above; the spread masks select exactly the values lanes of
                    // `m1` / `m2` read (`off + 2l`).
                    unsafe {
                        let lo = _mm512_maskz_loadu_ps(l1, s1);
                        let hi = _mm512_maskz_loadu_ps(h1, s1.wrapping_add(16));
                        let mut v = _mm512_permutex2var_ps(lo, even, hi);
                        if m2 != 0 {
                            let lo = _mm512_maskz_loadu_ps(l2, s2);
                            let hi = _mm512_maskz_loadu_ps(h2, s2.wrapping_add(16));
                            v = _mm512_mask_mov_ps(v, m2, _mm512_permutex2var_ps(lo, even, hi));
                        }
                        _mm512_storeu_ps(d0.add(i * dst_step), v);
                    }
                    s1 = s1.wrapping_add(src_step);
                    s2 = s2.wrapping_add(src_step);
                }
            }
            Chunk::Gather { mask, at } => {
                // SAFETY: `idx` holds 16 i32 values per row (bounds-checked index).
                let vi = unsafe { _mm512_loadu_si512(idx[at as usize].as_ptr().cast()) };
                let mut s = src;
                for i in 0..rows {
                    // SAFETY: the gather reads only the lanes of `mask` (valid by the
                    // contract); the store is the row's chunk.
                    unsafe {
                        let v =
                            _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, vi, s.cast());
                        _mm512_storeu_ps(d0.add(i * dst_step), v);
                    }
                    s = s.wrapping_add(src_step);
                }
            }
            Chunk::Lines { .. } => {
                // Another step (outside the contract's 1 and 2): lane by lane.
                // SAFETY: the caller's contract, passed on.
                unsafe {
                    scalar_rows(
                        d0,
                        dst_step,
                        rows,
                        src,
                        src_step,
                        std::slice::from_ref(c),
                        idx,
                    )
                };
            }
        }
    }
}

/// One chunk's 16 lanes read from `s` (the body of [`avx512_rows`] for one row).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn avx512_chunk(c: &Chunk, s: *const f32, idx: &[[i32; CHUNK_LANES]]) -> __m512 {
    // SAFETY: the caller's contract: the lanes in the masks are valid reads, the others are
    // not read (masked loads and gathers do not fault on them).
    unsafe {
        match *c {
            Chunk::Lines {
                step: 1,
                m1,
                m2,
                off1,
                off2,
            } => {
                let mut v = _mm512_maskz_loadu_ps(m1, s.wrapping_offset(off1));
                if m2 != 0 {
                    v = _mm512_mask_loadu_ps(v, m2, s.wrapping_offset(off2));
                }
                v
            }
            Chunk::Lines {
                step: 2,
                m1,
                m2,
                off1,
                off2,
            } => {
                let even =
                    _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                let piece = |m: u16, p: *const f32| {
                    let lo = _mm512_maskz_loadu_ps(spread(m), p);
                    let hi = _mm512_maskz_loadu_ps(spread(m >> 8), p.wrapping_add(16));
                    _mm512_permutex2var_ps(lo, even, hi)
                };
                let mut v = piece(m1, s.wrapping_offset(off1));
                if m2 != 0 {
                    v = _mm512_mask_mov_ps(v, m2, piece(m2, s.wrapping_offset(off2)));
                }
                v
            }
            Chunk::Gather { mask, at } => {
                let vi = _mm512_loadu_si512(idx[at as usize].as_ptr().cast());
                _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, vi, s.cast())
            }
            Chunk::Lines { .. } => {
                let mut v = [0f32; CHUNK_LANES];
                for (l, x) in v.iter_mut().enumerate() {
                    if let Some(o) = c.lane(l, idx) {
                        *x = *s.wrapping_offset(o);
                    }
                }
                _mm512_loadu_ps(v.as_ptr())
            }
        }
    }
}

/// 16 × 16 in registers: `r[p]` lane `l` becomes `r[l]` lane `p`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let (lo, hi) = (
        |a: __m512, b: __m512| {
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
        },
        |a: __m512, b: __m512| {
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
        },
    );
    for i in 0..4 {
        r[4 * i] = lo(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = hi(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = lo(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = hi(t[4 * i + 1], t[4 * i + 3]);
    }
    for i in 0..4 {
        t[i] = _mm512_shuffle_f32x4::<0x88>(r[i], r[i + 4]);
        t[i + 4] = _mm512_shuffle_f32x4::<0xdd>(r[i], r[i + 4]);
        t[8 + i] = _mm512_shuffle_f32x4::<0x88>(r[8 + i], r[12 + i]);
        t[12 + i] = _mm512_shuffle_f32x4::<0xdd>(r[8 + i], r[12 + i]);
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[i + 8]);
        r[i + 8] = _mm512_shuffle_f32x4::<0xdd>(t[i], t[i + 8]);
    }
}

/// The AVX-512 transposed body: per block of 16 rows and 16 columns, 16 chunk loads (one per
/// column), a transpose, and the block's rows stored.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx512_transposed(
    dst: *mut f32,
    ld: usize,
    rows: usize,
    src: *const f32,
    lanes: &[(isize, u32)],
    chunks: &[Chunk],
    per_block: usize,
    idx: &[[i32; CHUNK_LANES]],
) {
    for q in 0..rows.div_ceil(CHUNK_LANES) {
        let prow = CHUNK_LANES.min(rows - q * CHUNK_LANES);
        let block = &chunks[q * per_block..];
        for g in 0..ld / CHUNK_LANES {
            let mut r = [_mm512_setzero_ps(); 16];
            let cols = lanes.get(g * CHUNK_LANES..).unwrap_or(&[]);
            for (v, &(off, tap)) in r.iter_mut().zip(cols) {
                // SAFETY: the caller's contract for column `j` and the block's chunk.
                *v = unsafe { avx512_chunk(&block[tap as usize], src.wrapping_offset(off), idx) };
            }
            transpose16(&mut r);
            for (p, v) in r.iter().enumerate().take(prow) {
                // SAFETY: row `16q + p < rows`, columns `16g .. 16g + 16 <= ld`: inside dst.
                unsafe {
                    _mm512_storeu_ps(dst.add((q * CHUNK_LANES + p) * ld + g * CHUNK_LANES), *v)
                };
            }
        }
    }
}

/// Half `h` (lanes `8h .. 8h + 8`) of one chunk read from `s`: `vmaskmovps` for straight
/// stride-1 pieces, lane by lane otherwise.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn avx2_half(c: &Chunk, s: *const f32, h: usize, idx: &[[i32; CHUNK_LANES]]) -> __m256 {
    // SAFETY: the caller's contract: the lanes in the masks are valid reads, the others are
    // not read (`vmaskmovps` does not fault on them).
    unsafe {
        match *c {
            Chunk::Lines {
                step: 1,
                m1,
                m2,
                off1,
                off2,
            } => {
                let sh = 8 * h as u32;
                let mut v = _mm256_maskload_ps(
                    s.wrapping_offset(off1).wrapping_add(8 * h),
                    lane_mask(m1, sh),
                );
                if m2 != 0 {
                    let w = _mm256_maskload_ps(
                        s.wrapping_offset(off2).wrapping_add(8 * h),
                        lane_mask(m2, sh),
                    );
                    v = _mm256_or_ps(v, w);
                }
                v
            }
            _ => {
                let mut v = [0f32; 8];
                for (l, x) in v.iter_mut().enumerate() {
                    if let Some(o) = c.lane(8 * h + l, idx) {
                        *x = *s.wrapping_offset(o);
                    }
                }
                _mm256_loadu_ps(v.as_ptr())
            }
        }
    }
}

/// The AVX2 transposed body: blocks of 8 rows × 8 columns.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_transposed(
    dst: *mut f32,
    ld: usize,
    rows: usize,
    src: *const f32,
    lanes: &[(isize, u32)],
    chunks: &[Chunk],
    per_block: usize,
    idx: &[[i32; CHUNK_LANES]],
) {
    for q in 0..rows.div_ceil(8) {
        let prow = 8.min(rows - q * 8);
        let block = &chunks[(q / 2) * per_block..];
        for g in 0..ld / 8 {
            let mut r = [_mm256_setzero_ps(); 8];
            let cols = lanes.get(g * 8..).unwrap_or(&[]);
            for (v, &(off, tap)) in r.iter_mut().zip(cols) {
                // SAFETY: the caller's contract for the column and the block's chunk.
                *v = unsafe {
                    avx2_half(&block[tap as usize], src.wrapping_offset(off), q % 2, idx)
                };
            }
            // SAFETY: avx2 (this function's features).
            let r = unsafe { super::x86::transpose8x8(r) };
            for (p, v) in r.iter().enumerate().take(prow) {
                // SAFETY: row `8q + p < rows`, columns `8g .. 8g + 8 <= ld`: inside dst.
                unsafe { _mm256_storeu_ps(dst.add((q * 8 + p) * ld + g * 8), *v) };
            }
        }
    }
}

/// The 8 lanes of `m >> shift` as an AVX2 lane mask (all ones where the bit is set).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn lane_mask(m: u16, shift: u32) -> __m256i {
    let bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let v = _mm256_set1_epi32(i32::from((m >> shift) & 0xff));
    _mm256_cmpeq_epi32(_mm256_and_si256(v, bits), bits)
}

/// The AVX2 body: each chunk as two 8-lane halves; straight stride-1 pieces with `vmaskmovps`,
/// the rest (stride 2, gathers) with `vgatherdps` on indices set up once per chunk.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_rows(
    dst: *mut f32,
    dst_step: usize,
    rows: usize,
    src: *const f32,
    src_step: usize,
    chunks: &[Chunk],
    idx: &[[i32; CHUNK_LANES]],
) {
    for (q, c) in chunks.iter().enumerate() {
        let d0 = dst.wrapping_add(q * CHUNK_LANES);
        match *c {
            Chunk::Lines {
                step: 1,
                m1,
                m2,
                off1,
                off2,
            } => {
                let (a1, b1) = (lane_mask(m1, 0), lane_mask(m1, 8));
                let (a2, b2) = (lane_mask(m2, 0), lane_mask(m2, 8));
                let (mut s1, mut s2) = (src.wrapping_offset(off1), src.wrapping_offset(off2));
                for i in 0..rows {
                    // SAFETY: `vmaskmovps` reads only the lanes of its mask (valid by the
                    // contract; masked lanes do not fault); the stores are the row's chunk.
                    unsafe {
                        let mut lo = _mm256_maskload_ps(s1, a1);
                        let mut hi = _mm256_maskload_ps(s1.wrapping_add(8), b1);
                        if m2 != 0 {
                            let lo2 = _mm256_maskload_ps(s2, a2);
                            let hi2 = _mm256_maskload_ps(s2.wrapping_add(8), b2);
                            lo = _mm256_or_ps(lo, lo2);
                            hi = _mm256_or_ps(hi, hi2);
                        }
                        let d = d0.add(i * dst_step);
                        _mm256_storeu_ps(d, lo);
                        _mm256_storeu_ps(d.add(8), hi);
                    }
                    s1 = s1.wrapping_add(src_step);
                    s2 = s2.wrapping_add(src_step);
                }
            }
            _ => {
                // Per-lane offsets relative to `src` (a gather chunk's table row, or the
                // pieces' `off + 2l`), i32 by construction for gathers; pieces of a step-2 chunk
                // whose lanes do not fit an i32 read lane by lane.
                let mut offs = [0i32; CHUNK_LANES];
                let mut mask = 0u16;
                let mut fits = true;
                for (l, o) in offs.iter_mut().enumerate() {
                    if let Some(v) = c.lane(l, idx) {
                        mask |= 1 << l;
                        match i32::try_from(v) {
                            Ok(v) => *o = v,
                            Err(_) => fits = false,
                        }
                    }
                }
                if !fits {
                    // SAFETY: the caller's contract, passed on.
                    unsafe {
                        scalar_rows(
                            d0,
                            dst_step,
                            rows,
                            src,
                            src_step,
                            std::slice::from_ref(c),
                            idx,
                        )
                    };
                    continue;
                }
                // SAFETY: 16 i32 values in `offs`.
                let (ilo, ihi) = unsafe {
                    (
                        _mm256_loadu_si256(offs.as_ptr().cast()),
                        _mm256_loadu_si256(offs.as_ptr().add(8).cast()),
                    )
                };
                let (mlo, mhi) = (
                    _mm256_castsi256_ps(lane_mask(mask, 0)),
                    _mm256_castsi256_ps(lane_mask(mask, 8)),
                );
                let mut s = src;
                for i in 0..rows {
                    // SAFETY: the gathers read only the lanes of their masks (valid by the
                    // contract); the stores are the row's chunk.
                    unsafe {
                        let z = _mm256_setzero_ps();
                        let lo = _mm256_mask_i32gather_ps::<4>(z, s, ilo, mlo);
                        let hi = _mm256_mask_i32gather_ps::<4>(z, s, ihi, mhi);
                        let d = d0.add(i * dst_step);
                        _mm256_storeu_ps(d, lo);
                        _mm256_storeu_ps(d.add(8), hi);
                    }
                    s = s.wrapping_add(src_step);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The naive meaning of one packed row set, from the lane offsets the chunks were built
    /// from.
    fn naive(
        offs: &[Vec<Option<isize>>],
        rows: usize,
        src: &[f32],
        base: usize,
        src_step: usize,
    ) -> Vec<f32> {
        let w = offs.len() * CHUNK_LANES;
        let mut out = vec![f32::NAN; rows * w];
        for i in 0..rows {
            for (q, o) in offs.iter().enumerate() {
                for l in 0..CHUNK_LANES {
                    out[i * w + q * CHUNK_LANES + l] = match o.get(l).copied().flatten() {
                        Some(v) => src[((base + i * src_step) as isize + v) as usize],
                        None => 0.0,
                    };
                }
            }
        }
        out
    }

    /// Random chunk shapes (straight runs with gaps and a second piece, stride 1 and 2,
    /// scattered lanes, empty chunks, offsets before the row's base) on every family the CPU
    /// has, against the naive copy; the lanes read lie inside `src`, which ends right after
    /// the last value read by a masked load that would reach past it.
    #[test]
    fn every_family_matches_the_naive_copy() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let families: Vec<_> = Isa::available()
            .into_iter()
            .filter_map(|isa| ConvPack::new(isa).ok())
            .collect();
        assert!(!families.is_empty());
        for case in 0..400 {
            let nchunks = 1 + rng.below(3);
            let rows = 1 + rng.below(5);
            let src_step = 40 + rng.below(60);
            let margin = 40usize;
            let step = 1 + rng.below(2);
            let mut offs = Vec::new();
            for _ in 0..nchunks {
                let kind = rng.below(5);
                let mut o = vec![None; CHUNK_LANES];
                let b1 = rng.below(2 * margin) as isize - margin as isize;
                let b2 = rng.below(2 * margin) as isize - margin as isize;
                let cut = rng.below(17);
                for (l, slot) in o.iter_mut().enumerate() {
                    let s = (step * l) as isize;
                    let keep = rng.below(6) != 0;
                    *slot = match kind {
                        0 => None,
                        1 => keep.then_some(b1 + s),
                        2 if l < cut => keep.then_some(b1 + s),
                        2 => keep.then_some(b2 + s),
                        3 => keep.then(|| rng.below(2 * margin) as isize - margin as isize),
                        _ => Some(b1 + s),
                    };
                }
                // Keep every read inside [-margin, margin + 2·16).
                for v in o.iter_mut().flatten() {
                    *v = (*v).clamp(-(margin as isize), (margin + 2 * CHUNK_LANES) as isize);
                }
                offs.push(o);
            }
            let span = margin + (rows - 1) * src_step + margin + 2 * CHUNK_LANES + 1;
            let src: Vec<f32> = (0..span).map(|v| v as f32 + 0.5).collect();
            let mut idx = Vec::new();
            let chunks: Vec<Chunk> = offs
                .iter()
                .map(|o| Chunk::from_offsets(o, step, &mut idx).unwrap())
                .collect();
            let want = naive(&offs, rows, &src, margin, src_step);
            for f in &families {
                let w = nchunks * CHUNK_LANES;
                let dst_step = w + rng.below(3) * CHUNK_LANES;
                let mut dst = vec![f32::NAN; rows * dst_step];
                // SAFETY: rows of `w` values `dst_step` apart inside dst; every lane read lies
                // in src (offsets clamped to [-margin, margin + 32] around `margin + i·step`).
                unsafe {
                    f.pack_rows(
                        dst.as_mut_ptr(),
                        dst_step,
                        rows,
                        src.as_ptr().add(margin),
                        src_step,
                        &chunks,
                        &idx,
                    );
                }
                for i in 0..rows {
                    assert_eq!(
                        &dst[i * dst_step..][..w],
                        &want[i * w..][..w],
                        "case {case}, {:?}, row {i}, chunks {chunks:?}",
                        f.isa()
                    );
                }
            }
        }
    }

    /// The classification: straight lanes are one piece, two runs two pieces, a third run or
    /// a scatter a gather; step 2 only when asked for.
    #[test]
    fn offsets_are_classified() {
        let mut idx = Vec::new();
        let lanes = |f: &dyn Fn(usize) -> Option<isize>| (0..16).map(f).collect::<Vec<_>>();
        let one = lanes(&|l| (l > 0).then_some(l as isize - 9));
        assert_eq!(
            Chunk::from_offsets(&one, 1, &mut idx),
            Some(Chunk::Lines {
                step: 1,
                m1: 0xfffe,
                m2: 0,
                off1: -9,
                off2: 0
            })
        );
        let two = lanes(&|l| Some(if l < 8 { l as isize } else { l as isize + 8 }));
        assert!(matches!(
            Chunk::from_offsets(&two, 1, &mut idx),
            Some(Chunk::Lines {
                step: 1,
                m1: 0x00ff,
                m2: 0xff00,
                ..
            })
        ));
        let strided = lanes(&|l| Some(2 * l as isize + 3));
        assert!(matches!(
            Chunk::from_offsets(&strided, 2, &mut idx),
            Some(Chunk::Lines {
                step: 2,
                m1: 0xffff,
                off1: 3,
                ..
            })
        ));
        assert!(idx.is_empty());
        assert!(matches!(
            Chunk::from_offsets(&strided, 1, &mut idx),
            Some(Chunk::Gather {
                mask: 0xffff,
                at: 0
            })
        ));
        let three = lanes(&|l| Some((l / 5 * 100 + l) as isize));
        assert!(matches!(
            Chunk::from_offsets(&three, 1, &mut idx),
            Some(Chunk::Gather { at: 1, .. })
        ));
        let far = lanes(&|l| Some(if l == 3 { 1 << 40 } else { 7 * l as isize }));
        assert_eq!(Chunk::from_offsets(&far, 1, &mut idx), None);
        assert_eq!(
            Chunk::from_offsets(&[None; 16], 1, &mut idx),
            Some(Chunk::ZERO)
        );
    }

    /// The transposed packing on every family against the scalar body (itself checked
    /// against the lane meaning): random chunk blocks, columns reading from different bases,
    /// row counts that end inside a block, columns that leave the last 16 partly empty.
    #[test]
    fn transposed_matches_the_lane_meaning() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let families: Vec<_> = Isa::available()
            .into_iter()
            .filter_map(|isa| ConvPack::new(isa).ok())
            .collect();
        for case in 0..200 {
            let taps = 1 + rng.below(4);
            let rows = 1 + rng.below(40);
            let blocks = rows.div_ceil(CHUNK_LANES);
            let step = 1 + rng.below(2);
            let margin = 40isize;
            let mut idx = Vec::new();
            let mut offs = Vec::new();
            let mut chunks = Vec::new();
            for _ in 0..blocks * taps {
                let kind = rng.below(4);
                let b1 = rng.below(80) as isize - margin;
                let b2 = rng.below(80) as isize - margin;
                let cut = rng.below(17);
                let o: Vec<Option<isize>> = (0..CHUNK_LANES)
                    .map(|l| {
                        let s = (step * l) as isize;
                        let keep = rng.below(5) != 0;
                        let v = match kind {
                            0 => None,
                            1 => keep.then_some(b1 + s),
                            2 => Some(if l < cut { b1 + s } else { b2 + s }),
                            _ => keep.then(|| rng.below(80) as isize - margin),
                        };
                        v.map(|v| v.clamp(-margin, margin + 32))
                    })
                    .collect();
                chunks.push(Chunk::from_offsets(&o, step, &mut idx).unwrap());
                offs.push(o);
            }
            let ncols = 1 + rng.below(48);
            let ld = ncols.div_ceil(16) * 16 + 16 * rng.below(2);
            let span = 2000usize;
            let src: Vec<f32> = (0..span).map(|v| v as f32 + 0.25).collect();
            let lanes: Vec<(isize, u32)> = (0..ncols)
                .map(|_| (100 + rng.below(1800) as isize, rng.below(taps) as u32))
                .collect();
            let mut want = vec![0f32; rows * ld];
            for p in 0..rows {
                for (j, &(off, tap)) in lanes.iter().enumerate() {
                    if let Some(o) = offs[(p / 16) * taps + tap as usize][p % 16] {
                        want[p * ld + j] = src[(off + o) as usize];
                    }
                }
            }
            for f in &families {
                let mut dst = vec![f32::NAN; rows * ld];
                // SAFETY: `rows · ld` values in dst; every lane read is `off + o` with `off` in
                // 100..1900 and `o` in -40..=72: inside src; chunks cover every block.
                unsafe {
                    f.pack_transposed(
                        dst.as_mut_ptr(),
                        ld,
                        rows,
                        src.as_ptr(),
                        &lanes,
                        &chunks,
                        taps,
                        &idx,
                    )
                };
                assert_eq!(dst, want, "case {case}, {:?}", f.isa());
            }
        }
    }

    #[test]
    fn interleave_rows_matches_the_naive_copy() {
        let families: Vec<_> = Isa::available()
            .into_iter()
            .filter_map(|i| ConvPack::new(i).ok())
            .collect();
        let mut rng = Rng(7);
        for f in &families {
            for len in [0, 1, 5, 8, 15, 16, 17, 28, 31, 32, 33, 56] {
                {
                    let (rows, src_step, dst_step) = (5, len + 3, 2 * len + 7);
                    let lo: Vec<f32> = (0..rows * src_step)
                        .map(|_| rng.below(1000) as f32)
                        .collect();
                    let hi: Vec<f32> = (0..rows * src_step)
                        .map(|_| -(rng.below(1000) as f32))
                        .collect();
                    let mut dst = vec![f32::NAN; rows * dst_step];
                    let mut want = dst.clone();
                    for r in 0..rows {
                        for q in 0..len {
                            want[r * dst_step + 2 * q] = lo[r * src_step + q];
                            want[r * dst_step + 2 * q + 1] = hi[r * src_step + q];
                        }
                    }
                    // SAFETY: every row's writes (2·len ≤ dst_step) and reads (len ≤ src_step)
                    // lie inside the vectors; dst overlaps neither source.
                    unsafe {
                        f.interleave_rows(
                            dst.as_mut_ptr(),
                            dst_step,
                            lo.as_ptr(),
                            hi.as_ptr(),
                            src_step,
                            rows,
                            len,
                        )
                    };
                    let same = dst
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "len {len}, {:?}", f.isa());
                }
            }
        }
    }

    /// [`ConvPack::deinterleave_lines`] against the naive copy in every family: one and two
    /// lines a row, lengths below, at and past the vector widths (8, 16) and ResNet's 28 and
    /// 56, rows with gaps between them on both sides; nothing outside the phases' rows is
    /// written.
    #[test]
    fn deinterleave_lines_matches_the_naive_copy() {
        let families: Vec<_> = Isa::available()
            .into_iter()
            .filter_map(|i| ConvPack::new(i).ok())
            .collect();
        let mut rng = Rng(13);
        for f in &families {
            for lines in [1, 2] {
                for len in [0, 1, 5, 7, 8, 9, 15, 16, 17, 24, 28, 31, 32, 33, 56] {
                    let (rows, src_step, dst_step) = (5, 2 * lines * len + 3, len + 5);
                    let src: Vec<f32> = (0..rows * src_step)
                        .map(|_| rng.below(1000) as f32)
                        .collect();
                    let mut out = vec![vec![f32::NAN; rows * dst_step]; 2 * lines];
                    let mut want = out.clone();
                    for r in 0..rows {
                        for l in 0..lines {
                            for q in 0..len {
                                let s = r * src_step + 2 * len * l + 2 * q;
                                want[2 * l][r * dst_step + q] = src[s];
                                want[2 * l + 1][r * dst_step + q] = src[s + 1];
                            }
                        }
                    }
                    let dst: Vec<*mut f32> = out.iter_mut().map(|v| v.as_mut_ptr()).collect();
                    // SAFETY: every row's reads (2·lines·len <= src_step) and writes (len <=
                    // dst_step) lie inside the vectors, which do not overlap.
                    unsafe {
                        f.deinterleave_lines(&dst, dst_step, src.as_ptr(), src_step, rows, len)
                    };
                    for (i, (o, w)) in out.iter().zip(&want).enumerate() {
                        let same = o.iter().zip(w).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "phase {i}, lines {lines}, len {len}, {:?}", f.isa());
                    }
                }
            }
        }
    }

    /// [`ConvPack::interleave_lines`] against the naive copy: lengths whole and not multiples of
    /// 4 and 8, every misalignment of the rows' starts (a 64-byte-aligned buffer entered at
    /// offsets 0-15), plain and streaming stores; nothing outside the rows is written.
    #[test]
    fn interleave_lines_matches_the_naive_copy() {
        let families: Vec<_> = Isa::available()
            .into_iter()
            .filter_map(|i| ConvPack::new(i).ok())
            .collect();
        let mut rng = Rng(11);
        for f in &families {
            for len in [0, 1, 3, 4, 5, 8, 12, 16, 20, 28, 36, 56] {
                for shift in 0..16 {
                    for stream in [false, true] {
                        let (rows, src_step) = (4, len + 5);
                        let dst_step = 4 * len + 16 + shift % 3;
                        let src: Vec<Vec<f32>> = (0..4)
                            .map(|i| {
                                (0..rows * src_step)
                                    .map(|_| (rng.below(1000) + 1000 * i) as f32)
                                    .collect()
                            })
                            .collect();
                        let total = rows * dst_step + 32;
                        let mut buf = vec![f32::NAN; total + 16];
                        let align = (16 - (buf.as_ptr() as usize / 4) % 16) % 16;
                        let start = align + shift;
                        let mut want = buf.clone();
                        for r in 0..rows {
                            for q in 0..len {
                                let o = start + r * dst_step;
                                want[o + 2 * q] = src[0][r * src_step + q];
                                want[o + 2 * q + 1] = src[1][r * src_step + q];
                                want[o + 2 * len + 2 * q] = src[2][r * src_step + q];
                                want[o + 2 * len + 2 * q + 1] = src[3][r * src_step + q];
                            }
                        }
                        // SAFETY: every row's 4·len writes from `start + r·dst_step` lie inside
                        // `buf` (4·len <= dst_step, `total` covers the rows); the reads (len <=
                        // src_step) inside the sources, which `buf` does not overlap.
                        unsafe {
                            f.interleave_lines(
                                buf.as_mut_ptr().add(start),
                                dst_step,
                                [
                                    src[0].as_ptr(),
                                    src[1].as_ptr(),
                                    src[2].as_ptr(),
                                    src[3].as_ptr(),
                                ],
                                src_step,
                                rows,
                                len,
                                stream,
                            )
                        };
                        let same = buf
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "len {len}, shift {shift}, stream {stream}, {:?}",
                            f.isa()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn spread_moves_bit_l_to_2l() {
        for m in 0..256u16 {
            let want = (0..8)
                .filter(|l| m >> l & 1 == 1)
                .fold(0u16, |a, l| a | 1 << (2 * l));
            assert_eq!(spread(m), want);
        }
    }

    /// [`ConvRows::resolve`] of step-2 panels: one period of [`ConvRow2`]s (per chunk its
    /// pieces' byte offsets and the window masks of their lanes, a chunk without lanes
    /// zero-masked), the refusals (step-1 and step-2 chunks mixed, a gather, a lane read
    /// outside the source), and a panel with the same taps at another base.
    #[test]
    fn conv_rows_resolve_step2() {
        let two = |m1: u16, off1: isize, m2: u16, off2: isize| Chunk::Lines {
            step: 2,
            m1,
            m2,
            off1,
            off2,
        };
        // Tap 0: 48 lanes, the second chunk crossing at lane 4 (a second line at +120).
        // Tap 1: lane 0 and lane 31 in the padding, the last chunk without lanes.
        let taps = vec![
            two(0xffff, 10, 0, 0),
            two(0x000f, 42, 0xfff0, 162),
            two(0xffff, 194, 0, 0),
            two(0xfffe, 11, 0, 0),
            two(0x7fff, 43, 0, 0),
            two(0, 0, 0, 0),
        ];
        let mut p = ConvPanel {
            taps,
            period: 2,
            first: 0,
            base: 100,
            step: 1000,
        };
        let mut r = ConvRows::default();
        // 3 rows: taps 0, 1 of channel 0, tap 0 of channel 1; the last value read is
        // 100 + 1000 + 194 + 31 (tap 0's chunks have no lane in the padding: piece 1's windows
        // are read whole).
        assert!(r.resolve(&p, 100 + 1000 + 194 + 32, 3, 3));
        assert!(r.strided);
        assert_eq!((r.step, r.rows2.len()), (4000, 2));
        let r0 = r.rows2[0];
        // Pieces without lanes stay at the channel's base (their loads are masked off).
        assert_eq!(r0.off, [440, 400, 4 * 142, 4 * 262, 4 * 294, 400]);
        assert_eq!(
            r0.m,
            [
                0xffff, 0xffff, 0, 0, 0xffff, 0xffff, 0x5500, 0x5555, 0xffff, 0xffff, 0, 0
            ]
        );
        // Tap 1: lanes 0 and 31 in the padding, its masks select its lanes only.
        let r1 = r.rows2[1];
        assert_eq!(r1.m[..8], [0x5554, 0x5555, 0, 0, 0x5555, 0x1555, 0, 0]);
        assert_eq!(r1.m[8..], [0, 0, 0, 0]);
        assert!(!r.resolve(&p, 100 + 1000 + 194 + 31, 3, 3));
        // The same taps at another base: the offsets move with it.
        p.base = 7;
        assert!(r.resolve(&p, 10_000, 3, 3));
        assert_eq!(r.rows2[0].off[0], 4 * 17);
        p.base = -11;
        assert!(!r.resolve(&p, 10_000, 3, 3));
        p.base = -10;
        assert!(r.resolve(&p, 10_000, 3, 3));
        for bad in [
            Chunk::Lines {
                step: 1,
                m1: 1,
                m2: 0,
                off1: 0,
                off2: 0,
            },
            Chunk::Gather { mask: 1, at: 0 },
        ] {
            let mut q = p.clone();
            q.taps[4] = bad;
            assert!(!r.resolve(&q, 10_000, 3, 3));
        }
    }

    /// [`ConvRows::resolve`] with its memos: random step-1 and step-2 panels (more distinct
    /// ones than [`MEMOS`], so that memos are replaced), resolved in a random order at random
    /// bases by one `ConvRows`, give what a fresh one gives (success, form, step, every row's
    /// offsets and masks); so do two panels with the same hash (their taps differ past each
    /// tap's first chunk only).
    #[test]
    fn conv_rows_memos_resolve_as_fresh() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(38);
        let nch = 3;
        let mut panels: Vec<(ConvPanel, usize)> = (0..MEMOS + 9)
            .map(|i| {
                let period = rng.random_range(1..=9);
                let taps = (0..period * nch)
                    .map(|j| {
                        let m1: u16 = rng.random();
                        if i % 2 == 0 {
                            let m2 = rng.random::<u16>() & !m1;
                            Chunk::Lines {
                                step: 2,
                                m1,
                                m2,
                                off1: rng.random_range(-40i64..200) as isize,
                                off2: rng.random_range(-40i64..200) as isize,
                            }
                        } else {
                            Chunk::Lines {
                                step: 1,
                                m1,
                                m2: 0,
                                off1: 16 * (j % nch) as isize + (j / nch) as isize * 7 - 5,
                                off2: 0,
                            }
                        }
                    })
                    .collect();
                let p = ConvPanel {
                    taps,
                    period,
                    first: rng.random_range(0..period),
                    base: 0,
                    step: rng.random_range(0i64..400) as isize,
                };
                (p, rng.random_range(1..30))
            })
            .collect();
        // Same hash as panel 0 (each tap's first chunk unchanged), other taps.
        let mut twin = panels[0].clone();
        if let Chunk::Lines { m1, .. } = &mut twin.0.taps[1] {
            *m1 ^= 0x0ff0;
        }
        assert_eq!(
            memo_hash(&twin.0, twin.1, nch),
            memo_hash(&panels[0].0, panels[0].1, nch)
        );
        panels.push(twin);
        let mut r = ConvRows::default();
        for _ in 0..2000 {
            let i = if rng.random_bool(0.3) {
                [0, panels.len() - 1][rng.random_range(0..2)]
            } else {
                rng.random_range(0..panels.len())
            };
            let (p, kc) = &mut panels[i];
            p.base = rng.random_range(-50i64..2000) as isize;
            let len = rng.random_range(1000..12_000);
            let mut fresh = ConvRows::default();
            let want = fresh.resolve(p, len, *kc, nch);
            assert_eq!(r.resolve(p, len, *kc, nch), want, "panel {i}");
            if !want {
                continue;
            }
            assert_eq!(
                (r.strided, r.step),
                (fresh.strided, fresh.step),
                "panel {i}"
            );
            if r.strided {
                assert_eq!(r.rows2.len(), fresh.rows2.len());
                for (a, b) in r.rows2.iter().zip(&fresh.rows2) {
                    assert_eq!((a.off, a.m, a.pf), (b.off, b.m, b.pf), "panel {i}");
                }
            } else {
                assert_eq!(r.rows.len(), fresh.rows.len());
                for (a, b) in r.rows.iter().zip(&fresh.rows) {
                    assert_eq!((a.off, a.m, a.pf), (b.off, b.m, b.pf), "panel {i}");
                }
            }
        }
        assert_eq!(r.memos.len(), MEMOS);
    }

    /// [`ConvRows::resolve`]: one period of rows from the panel's first row, byte offsets,
    /// the masks per chunk, and the refusals (two pieces, a gather, offsets outside the
    /// source at the first or the last period, chunks that do not continue the row).
    #[test]
    fn conv_rows_resolve_and_check() {
        let line = |m1: u16, off1: isize| Chunk::Lines {
            step: 1,
            m1,
            m2: 0,
            off1,
            off2: 0,
        };
        // Two taps of three chunks: tap 0 reads 48 lanes at 10, tap 1 the last 40 at 20.
        let taps = vec![
            line(0xffff, 10),
            line(0xffff, 26),
            line(0xffff, 42),
            line(0xff00, 20),
            line(0xffff, 36),
            Chunk::ZERO,
        ];
        let mut p = ConvPanel {
            taps,
            period: 2,
            first: 1,
            base: 100,
            step: 1000,
        };
        let mut r = ConvRows::default();
        // 5 rows: taps 1, 0, 1, 0, 1 of channels 0, 1, 1, 2, 2 (from base).
        assert!(r.resolve(&p, 100 + 2000 + 10 + 48, 5, 3));
        assert_eq!(r.step, 4000);
        assert_eq!(r.rows.len(), 2);
        // The rows prefetch line `tap mod 3` of their window two panels on.
        assert_eq!(
            (r.rows[0].off, r.rows[0].m, r.rows[0].pf),
            (4 * 120, [0xff00, 0xffff, 0], 384 + 64)
        );
        assert_eq!(
            (r.rows[1].off, r.rows[1].m, r.rows[1].pf),
            (4 * 1110, [0xffff, 0xffff, 0xffff], 384)
        );
        // Row 3 (tap 0 of channel 2) reads up to 100 + 2000 + 10 + 47.
        assert!(!r.resolve(&p, 100 + 2000 + 10 + 47, 5, 3));
        // Fewer rows than the period: one entry.
        assert!(r.resolve(&p, 200, 1, 3));
        assert_eq!(r.rows.len(), 1);
        // Before the source.
        p.base = -30;
        assert!(!r.resolve(&p, 10_000, 5, 3));
        p.base = 100;
        // A chunk that does not continue its row, a second piece, a gather.
        for bad in [
            line(0xffff, 43),
            Chunk::Lines {
                step: 1,
                m1: 0xff,
                m2: 0xff00,
                off1: 26,
                off2: 30,
            },
            Chunk::Gather { mask: 1, at: 0 },
        ] {
            let mut q = p.clone();
            q.taps[1] = bad;
            assert!(!r.resolve(&q, 10_000, 5, 3));
        }
        assert!(r.resolve(&p, 10_000, 5, 3));
        // A panel that differs only by its base (resolved from the last one's rows) resolves
        // as it would alone, and its bounds are checked at the new base.
        for base in [100, 7, 3000, 0] {
            p.base = base;
            let mut fresh = ConvRows::default();
            assert!(fresh.resolve(&p, 10_000, 5, 3));
            assert!(r.resolve(&p, 10_000, 5, 3));
            assert_eq!(r.step, fresh.step);
            assert_eq!(r.rows.len(), fresh.rows.len());
            for (a, b) in r.rows.iter().zip(&fresh.rows) {
                assert_eq!((a.off, a.m), (b.off, b.m));
            }
        }
        p.base = 10_000 - 2000 - 10 - 47;
        assert!(!r.resolve(&p, 10_000, 5, 3));
        assert!(!ConvRows::default().resolve(&p, 10_000, 5, 3));
        p.base = -29;
        assert!(!r.resolve(&p, 10_000, 5, 3));
        p.base = -28;
        assert!(r.resolve(&p, 10_000, 5, 3));
    }
}
