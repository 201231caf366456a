//! convgemm: the forward convolution as a GEMM whose B operand, im2col(x), is never built.
//!
//! The convgemm paper's Fig. 6: when the GEMM packs the `kc × nc` block of B at `(pc, jc)` into
//! NR-wide micro-panels, [`Im2colB`] reads the values straight from the input tensor. Row `p` of
//! B is (channel, kernel tap), column `j` is (image, output position). Each panel's columns are
//! cut into runs along the innermost output dimension, with a (tap × run) segment table (see
//! `source.rs`); every row of the panel then is a few copies of input runs, zero-filled first
//! where some run overhangs the padding. The tables depend only on the panel's position inside
//! an image, so they are cached per thread across calls (core-blas's small-m schedule packs one
//! or two micro-panels per call; every KC block of an NC block packs the same panel positions)
//! and reused for every image, within [`PANEL_TABLE_BYTES`] per thread. Full panels of 16-value
//! chunks (AVX2's 16, AVX-512's 32 and 48) are packed by core-blas's [`ConvPack`] from a
//! [`Chunk`] per (tap, 16 columns), built from the segments with the tables: one or two masked
//! vector loads per chunk and channel (the padding never read), a gather where the columns
//! cross more than two stretches (planes smaller than a chunk, strided lines).

use std::cell::RefCell;

use core_blas::{CHUNK_LANES, Chunk, ConvPack, ConvPanel, PackB};

use crate::bytes_of;
use crate::geometry::{ConvGeometry, Dims3};
use crate::source::{Run, Seg, Source, copy_run, micro_panels};

/// im2col(x) of one group as a virtual `(C/G·R) × (N·O)` matrix that packs itself.
#[derive(Clone, Copy, Debug)]
pub struct Im2colB<'a> {
    src: Source<'a>,
    rows: usize,
    cols: usize,
    /// First column of the view: a view of images `n0..` starts at `n0 · wlen`.
    col0: usize,
    /// The output positions of each image the columns cover: `wlen` of them from `wlo` on
    /// (all O by default); column `j` (from `col0` on) is image `j / wlen`, position `wlo + j
    /// % wlen`.
    wlo: usize,
    wlen: usize,
    /// The taps of the view: `taps` of them from `tap0` on (all by default), in groups of `gw`
    /// consecutive taps (one group by default), rows group by group: row `p` is group `p /
    /// (C/G · gw)`, and inside its group channel `(p / gw) % C/G`, tap `p % gw` of the group
    /// (with one group: channel `p / taps`, tap `tap0 + p % taps`). Tap `t` is kernel tap `t`,
    /// or `map[t]` with a tap map: `tap0` then counts entries of the map.
    tap0: usize,
    taps: usize,
    gw: usize,
    /// Whether [`PackB::conv_panel`] describes full panels (the forward convgemm's B only:
    /// elsewhere the rows may grow with the batch, and the description's per-row table with
    /// them).
    fused: bool,
    /// Whether full panels of a stride-2 layer are described too ([`Im2colB::with_strided_fusion`]).
    strided: bool,
    /// A fused stride-2 view's column blocks as the driver runs them (width, panel width),
    /// when known ([`Im2colB::with_block_hints`]): [`PackB::prefetch_b`] then hints each
    /// block's first panel in the last panel before it.
    blocks: Option<(usize, usize)>,
    /// The kernel taps the view's taps index ([`Im2colB::with_tap_map`]): tap `t` of the view
    /// is kernel tap `map[tap0 + t]`; without a map it is kernel tap `tap0 + t`. Every view
    /// derived from a mapped one (tap ranges, tap groups, one group's view) keeps indexing
    /// the map, so the two compose.
    map: Option<&'a [usize]>,
}

/// Scratch reused across calls on one thread: no allocation in steady state.
#[derive(Default)]
struct Scratch {
    /// The geometry (and panel width) the cached tables below belong to.
    key: Option<(Dims3, [usize; 6])>,
    /// Per output position O of the first column of a full panel: index into `entries`.
    slots: Vec<u32>,
    entries: Vec<Entry>,
    /// Runs, segments (tap-major, `at` relative to the panel's first image) and per-tap
    /// "reads every position" flags of the cached entries, back to back.
    runs: Vec<Run>,
    segs: Vec<Seg>,
    full: Vec<bool>,
    lin: Vec<Lin>,
    /// Per tap of an entry, `nr / 16` [`Chunk`]s (when the panel width is a multiple of 16 and
    /// core-blas's [`ConvPack`] is there), and the gathers' index rows.
    chunks: Vec<Chunk>,
    gidx: Vec<[i32; CHUNK_LANES]>,
}

/// A tap of a full panel of a [`fixed_width`] (stride 1 or 2) whose readable positions all lie
/// on one straight stretch of a channel plane: the row is `nr` values copied from `base` on,
/// every `stride`-th (relative to the plane of the panel's image, `base + stride·nr <= plane
/// length`), then the positions in `mask` (which fall in the padding, or read across a line
/// end) set to zero.
#[derive(Clone, Copy, Default)]
struct Lin {
    ok: bool,
    base: usize,
    mask: u64,
}

/// Where the tables of one panel position live in [`Scratch`]: `count` runs from `runs`, `count
/// · R` segments from `segs`, R flags from `full` and R [`Lin`]s from `lin`.
#[derive(Clone, Copy)]
struct Entry {
    runs: usize,
    count: usize,
    segs: usize,
    full: usize,
    lin: usize,
    /// First of the entry's `R · nr / 16` chunks, [`NO_CHUNKS`] without.
    chunks: usize,
    /// Whether the entry stays in the tables (a full panel of a view with slots); otherwise
    /// [`Scratch::drop_entry`] removes it once its panel is packed.
    kept: bool,
}

/// An [`Entry`] without chunks.
const NO_CHUNKS: usize = usize::MAX;

/// The panel widths whose full rows are copied as one fixed-size block: AVX2's NR (16) and
/// AVX-512's (32, or 48 for an 8×48 tile); `mask` bits cover all three.
const fn fixed_width(nr: usize) -> bool {
    nr == 16 || nr == 32 || nr == 48
}

/// Copies `W` values of a straight stretch into a panel row: `from[0], from[1], ..` (stride
/// 1) or `from[0], from[2], ..` (stride 2, `2·W` values read).
///
/// # Safety
/// `d` is valid for `W` writes and `from` for `stride · W` reads (`stride` 1 or 2).
#[inline(always)]
unsafe fn copy_fixed<const W: usize>(d: *mut f32, from: *const f32, stride: usize) {
    // SAFETY: the caller's contract: `W` values at `d`, `stride · W` at `from`.
    unsafe {
        if stride == 1 {
            let v = from.cast::<[f32; W]>().read_unaligned();
            d.cast::<[f32; W]>().write_unaligned(v);
        } else {
            // Every other value of 2·W, read as two blocks of W (`vpermt2ps` / `shufps`).
            let lo = from.cast::<[f32; W]>().read_unaligned();
            let hi = from.add(W).cast::<[f32; W]>().read_unaligned();
            let even: [f32; W] =
                std::array::from_fn(|t| if 2 * t < W { lo[2 * t] } else { hi[2 * t - W] });
            d.cast::<[f32; W]>().write_unaligned(even);
        }
    }
}

/// Channels of one packing pass over a tap's rows when the channel planes alias in L1 (see
/// [`channel_block`]): the L1d's ways (8 on the machines we tune on).
const L1_WAYS: usize = 8;

/// How many channels [`Im2colB`] packs tap by tap before moving to the next channels, for
/// `channels` channels in the block of B whose planes lie `plane_bytes` apart. Tap by tap over
/// all of them re-reads each channel's input lines once per tap; that hits L1 unless the
/// planes' same positions fall into the same L1 sets: with planes a multiple of 4 KiB apart
/// (VGG's 224², 196 KiB) every channel lands in one set, and more than [`L1_WAYS`] channels
/// per pass evict each other's lines between taps. Then the channels go in blocks that fill
/// the ways. `probe_passes 1 64 64 224x224 3x3 1 1 3 fwd/convgemm`, quiet 21:21:33 UTC,
/// two rounds, blocks of all (64 or KC's share) / 2 / 4 / 8 / 16 channels: 43.5-43.7 /
/// 42.9-43.3 / 39.4-39.6 / 38.0 / 39.9-40.2 ms; ResNet-50 64@56² (planes 256 bytes off a 4
/// KiB multiple: 16 channels before two share a set) and C3D 64@8×56² (2048 bytes off, KC
/// holds ~13 channels) were level or slower with blocks, so they keep one pass.
fn channel_block(channels: usize, plane_bytes: usize) -> usize {
    // Channels whose planes start at distinct 4 KiB offsets before the offsets repeat.
    let distinct = 4096 / gcd(plane_bytes, 4096);
    if channels > L1_WAYS * distinct {
        L1_WAYS * distinct
    } else {
        channels.max(1)
    }
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// No cached entry for this position.
const EMPTY: u32 = u32::MAX;

/// Scratches (tables of distinct views) a thread keeps: the row-class forward
/// ([`crate::layout::forward_classes`]) packs one view per class of output rows (3 for a 3×3
/// kernel) in turn, and a single cache started over at every switch, so that every call
/// rebuilt the middle class's tables (`Im2colB::entry`, `Chunk::from_offsets`: ~0.9% of
/// 128@28²'s forward).
const SCRATCH_SETS: usize = 4;

/// Bytes the panel tables of a thread's scratches take together at most (the capacities of
/// all their vectors, slots included): a new entry that would pass it first frees the least
/// recently used other scratches, then starts its own tables over; a view whose slots alone do
/// not fit caches nothing. The lean rows' views need up to 3.2 MiB (C3D 64@8×56², one view;
/// VGG 64@224² 1.9 MiB; ResNet-50's row classes 0.1-0.3 MiB for their three views, the
/// stride-2 phase split's four 0.3 MiB): probe_passes with the bytes printed, session 35.
pub const PANEL_TABLE_BYTES: usize = 4 << 20;

/// What the tables themselves may take: [`PANEL_TABLE_BYTES`] less the thread's list of
/// scratches.
const ROOM: usize = PANEL_TABLE_BYTES - SCRATCH_SETS * size_of::<Scratch>();

thread_local! {
    /// The thread's scratches, the most recently used first.
    static SCRATCH: RefCell<Vec<Scratch>> = const { RefCell::new(Vec::new()) };
    /// The runs of the block [`PackB::prefetch_b`] hints at.
    static PREFETCH_RUNS: RefCell<Vec<Run>> = const { RefCell::new(Vec::new()) };
}

/// Bytes of the panel tables on this thread: its scratches and the prefetch hint's runs
/// (0 for those in use by a pass running on this thread).
pub(crate) fn thread_table_bytes() -> usize {
    let sets = SCRATCH.with(|c| c.try_borrow().map_or(0, |sets| sets_bytes(&sets)));
    let runs = PREFETCH_RUNS.with(|c| c.try_borrow().map_or(0, |r| bytes_of(&r)));
    sets + runs
}

/// Frees this thread's panel tables ([`crate::release_workspaces`]) and returns their bytes;
/// 0 for those in use.
pub(crate) fn release_thread() -> usize {
    crate::take_thread_buffer(&SCRATCH, |sets| sets_bytes(&sets))
        + crate::take_thread_buffer(&PREFETCH_RUNS, |r| bytes_of(&r))
}

/// Bytes of a thread's scratches: their list and their tables.
fn sets_bytes(sets: &Vec<Scratch>) -> usize {
    bytes_of(sets) + sets.iter().map(Scratch::bytes).sum::<usize>()
}

/// How many values one more entry may add to each table of a [`Scratch`] (upper bounds).
struct Need {
    runs: usize,
    segs: usize,
    taps: usize,
    chunks: usize,
}

impl Scratch {
    /// Bytes the scratch holds: the capacities of its vectors.
    fn bytes(&self) -> usize {
        bytes_of(&self.slots)
            + bytes_of(&self.entries)
            + bytes_of(&self.runs)
            + bytes_of(&self.segs)
            + bytes_of(&self.full)
            + bytes_of(&self.lin)
            + bytes_of(&self.chunks)
            + bytes_of(&self.gidx)
    }

    /// Capacity for `need` more values in every table (and one entry), grown only if the
    /// scratch then takes at most `room` bytes; false (nothing grown) otherwise. A table
    /// that must grow doubles if that fits, else takes what it needs and a share of the
    /// room left.
    fn grow(&mut self, need: &Need, room: usize) -> bool {
        // (len, capacity, add, size of a value) of every table that grows.
        let t = [
            (
                self.entries.len(),
                self.entries.capacity(),
                1,
                size_of::<Entry>(),
            ),
            (
                self.runs.len(),
                self.runs.capacity(),
                need.runs,
                size_of::<Run>(),
            ),
            (
                self.segs.len(),
                self.segs.capacity(),
                need.segs,
                size_of::<Seg>(),
            ),
            (
                self.full.len(),
                self.full.capacity(),
                need.taps,
                size_of::<bool>(),
            ),
            (
                self.lin.len(),
                self.lin.capacity(),
                need.taps,
                size_of::<Lin>(),
            ),
            (
                self.chunks.len(),
                self.chunks.capacity(),
                need.chunks,
                size_of::<Chunk>(),
            ),
            (
                self.gidx.len(),
                self.gidx.capacity(),
                need.chunks,
                size_of::<[i32; CHUNK_LANES]>(),
            ),
        ];
        let cap = |doubled: bool| {
            t.map(|(len, cap, add, _)| {
                if len + add <= cap {
                    cap
                } else if doubled {
                    (2 * cap).max(len + add)
                } else {
                    len + add
                }
            })
        };
        let bytes = |caps: &[usize; 7]| {
            bytes_of(&self.slots) + caps.iter().zip(&t).map(|(c, x)| c * x.3).sum::<usize>()
        };
        let c = if bytes(&cap(true)) <= room {
            cap(true)
        } else {
            // Near the bound: just what is needed, and the rest of the room shared among
            // the tables that grow (so that the next entries rarely grow them again).
            let mut c = cap(false);
            let Some(spare) = room.checked_sub(bytes(&c)) else {
                return false;
            };
            let grown = (0..7).filter(|&i| c[i] > t[i].1).count();
            for (ci, x) in c.iter_mut().zip(&t) {
                if *ci > x.1 {
                    *ci += spare / grown / x.3;
                }
            }
            c
        };
        self.entries.reserve_exact(c[0] - self.entries.len());
        self.runs.reserve_exact(c[1] - self.runs.len());
        self.segs.reserve_exact(c[2] - self.segs.len());
        self.full.reserve_exact(c[3] - self.full.len());
        self.lin.reserve_exact(c[4] - self.lin.len());
        self.chunks.reserve_exact(c[5] - self.chunks.len());
        self.gidx.reserve_exact(c[6] - self.gidx.len());
        true
    }

    /// Removes entry `e`, the last one pushed, unless it is kept (see [`Entry::kept`]).
    fn drop_entry(&mut self, e: Entry) {
        if e.kept {
            return;
        }
        self.entries.pop();
        self.runs.truncate(e.runs);
        self.segs.truncate(e.segs);
        self.full.truncate(e.full);
        self.lin.truncate(e.lin);
        if e.chunks != NO_CHUNKS {
            self.chunks.truncate(e.chunks);
        }
        if self.bytes() > ROOM {
            // Only after a panel whose tables alone did not fit: give them back.
            *self = Scratch {
                key: self.key,
                ..Scratch::default()
            };
        }
    }

    /// Drops every cached entry's tables (the slots must be reset with them).
    fn clear_tables(&mut self) {
        self.entries.clear();
        self.runs.clear();
        self.segs.clear();
        self.full.clear();
        self.lin.clear();
        self.chunks.clear();
        self.gidx.clear();
    }
}

/// Makes room for one more entry of `need` in the first of `sets` within [`PANEL_TABLE_BYTES`] for
/// all of them: frees the least recently used of the others, then starts the first's tables
/// over, as far as needed; false if even then it does not fit (it is then grown anyway).
fn make_room(sets: &mut [Scratch], need: &Need) -> bool {
    let Some((s, rest)) = sets.split_first_mut() else {
        return false;
    };
    let mut others: usize = rest.iter().map(Scratch::bytes).sum();
    let mut evict = rest.len();
    loop {
        if s.grow(need, ROOM.saturating_sub(others)) {
            return true;
        }
        if evict > 0 {
            evict -= 1;
            others -= rest[evict].bytes();
            rest[evict] = Scratch::default();
        } else if !s.entries.is_empty() {
            s.slots.fill(EMPTY);
            s.clear_tables();
        } else {
            s.grow(need, usize::MAX);
            return false;
        }
    }
}

/// The slots of a view's `wlen` positions in the first of `sets` (its tables empty), within
/// [`PANEL_TABLE_BYTES`] for all of them: frees the least recently used of the others, then the
/// first's own table capacity, as far as needed; without them (too many positions) the view
/// caches nothing.
fn make_slots(sets: &mut [Scratch], wlen: usize) {
    let Some((s, rest)) = sets.split_first_mut() else {
        return;
    };
    if wlen * size_of::<u32>() > ROOM {
        return;
    }
    let mut others: usize = rest.iter().map(Scratch::bytes).sum();
    let mut evict = rest.len();
    loop {
        let slots = s.slots.capacity().max(wlen) * size_of::<u32>();
        if s.bytes() - bytes_of(&s.slots) + slots + others <= ROOM {
            s.slots.reserve_exact(wlen);
            s.slots.resize(wlen, EMPTY);
            return;
        }
        if evict > 0 {
            evict -= 1;
            others -= rest[evict].bytes();
            rest[evict] = Scratch::default();
        } else if s.bytes() > 0 {
            *s = Scratch {
                key: s.key,
                ..Scratch::default()
            };
        } else {
            return;
        }
    }
}

impl<'a> Im2colB<'a> {
    /// The im2col matrix of group `grp` of `x` (validated by the caller: `x.len() == g.x_len()`).
    pub fn new(g: &ConvGeometry, grp: usize, x: &'a [f32]) -> Self {
        Self::images(g, grp, x, 0, g.batch())
    }

    /// The columns of images `n0..n0 + count` only (validated by the caller:
    /// `n0 + count <= g.batch()`).
    pub fn images(g: &ConvGeometry, grp: usize, x: &'a [f32], n0: usize, count: usize) -> Self {
        debug_assert!(n0 + count <= g.batch());
        Im2colB {
            src: Source::new(g, grp, x),
            rows: g.in_channels_per_group() * g.kernel_len(),
            cols: count * g.output_spatial_len(),
            col0: n0 * g.output_spatial_len(),
            wlo: 0,
            wlen: g.output_spatial_len(),
            tap0: 0,
            taps: g.kernel_len(),
            gw: g.kernel_len(),
            fused: false,
            strided: false,
            blocks: None,
            map: None,
        }
    }

    /// The same matrix, whose full panels core-blas's AVX-512 kernel may pack inside its first
    /// tile ([`PackB::conv_panel`], stride-1 layers).
    pub fn with_fused_packing(self) -> Self {
        Im2colB {
            fused: true,
            ..self
        }
    }

    /// The same matrix with fused packing ([`Im2colB::with_fused_packing`]) on stride 2 along
    /// the innermost dimension too: core-blas's AVX-512 first tile then packs each 16-lane
    /// chunk from one or two stride-2 pieces of x's lines (the phase-split forward's direct
    /// form, [`crate::phasesplit`]).
    pub(crate) fn with_strided_fusion(self) -> Self {
        Im2colB {
            fused: true,
            strided: true,
            ..self
        }
    }

    /// The same fused stride-2 view ([`Im2colB::with_strided_fusion`]) for a product that the
    /// driver runs in column blocks of `width` columns from the view's first one (the last
    /// one narrower), panels `nr` wide: the driver's prefetch of the next block (or of the
    /// next pass over the same block) comes in slices, one per panel of the current block,
    /// in column order; the view takes the slice that ends a block as the hint of that
    /// block's first panel, whose tile reads x first (see [`PackB::prefetch_b`]). A wrong
    /// width only moves the hints (no effect on the values).
    pub(crate) fn with_block_hints(self, width: usize, nr: usize) -> Self {
        Im2colB {
            blocks: (width > 0 && nr > 0).then_some((width, nr)),
            ..self
        }
    }

    /// Prefetches (into L2) the x lines that columns `jc..jc + nc` of rows `pc..pc + kc`
    /// read: [`PackB::prefetch_b`] without its choice of hints.
    pub(crate) fn prefetch_columns(&self, pc: usize, kc: usize, jc: usize, nc: usize) {
        if kc == 0 || nc == 0 {
            return;
        }
        let src = &self.src;
        PREFETCH_RUNS.with_borrow_mut(|runs| {
            src.runs(self.col0 + jc, nc, runs);
            src.prefetch(runs, self.channels(pc, kc), self.strided);
        });
    }

    /// The channels (of the group) that rows `pc..pc + kc` read (`kc > 0`).
    fn channels(&self, pc: usize, kc: usize) -> std::ops::Range<usize> {
        pc / self.taps..(pc + kc - 1) / self.taps + 1
    }

    /// The rows of kernel taps `tap0..tap0 + taps` (flat, row-major over the kernel's
    /// dimensions) only: C/G · `taps` rows, row `p` = channel `p / taps`, tap `tap0 + p %
    /// taps` (validated by the caller: `tap0 + taps <= R`). On a view with a tap map
    /// ([`Im2colB::with_tap_map`]) the taps are entries `tap0..tap0 + taps` of the map
    /// (`tap0 + taps <= map.len()`).
    pub(crate) fn with_taps(self, tap0: usize, taps: usize) -> Self {
        debug_assert!(taps > 0 && tap0 + taps <= self.map.map_or(self.src.rlen, <[usize]>::len));
        Im2colB {
            rows: self.rows / self.taps * taps,
            tap0,
            taps,
            gw: taps,
            ..self
        }
    }

    /// The rows of kernel taps `tap0..tap0 + groups · gw` group by group, `gw` consecutive
    /// taps a group: row `p` is group `q = p / (C/G · gw)`, channel `(p / gw) % C/G`, tap
    /// `tap0 + q · gw + p % gw`. A K range of whole groups is then a block of consecutive
    /// rows (the A operand's columns in the same order serve every such range). Validated by
    /// the caller: `tap0 + groups · gw <= R`. On a view with a tap map the groups are runs of
    /// the map's entries, as in [`Im2colB::with_taps`].
    pub(crate) fn with_tap_groups(self, tap0: usize, groups: usize, gw: usize) -> Self {
        Im2colB {
            gw: gw.max(1),
            ..self.with_taps(tap0, groups * gw)
        }
    }

    /// Only the output positions `wlo..wlo + wlen` of each image as columns: column `j` is
    /// image `n0 + j / wlen`, position `wlo + j % wlen` (validated by the caller: `wlo + wlen
    /// <= O`, `wlen > 0`). A view of all images (from [`Im2colB::new`]).
    pub(crate) fn with_window(self, wlo: usize, wlen: usize) -> Self {
        debug_assert!(wlen > 0 && wlo + wlen <= self.src.olen());
        let n0 = self.col0 / self.wlen;
        let count = self.cols / self.wlen;
        Im2colB {
            cols: count * wlen,
            col0: n0 * wlen,
            wlo,
            wlen,
            ..self
        }
    }

    /// The rows of the kernel taps `map[0], map[1], ..` only, in that order: C/G · `map.len()`
    /// rows, row `p` = channel `p / map.len()`, tap `map[p % map.len()]` (validated by the
    /// caller: every tap below R, `map` not empty). It replaces the view's taps (one group of
    /// all of them); [`Im2colB::with_taps`] and [`Im2colB::with_tap_groups`] on the result
    /// select among the map's entries. The phase-split forward ([`crate::phasesplit`]) reads a
    /// strided layer's taps as some of the taps of a stride-1 layer over x's phases.
    pub(crate) fn with_tap_map(self, map: &'a [usize]) -> Self {
        debug_assert!(!map.is_empty() && map.iter().all(|&t| t < self.src.rlen));
        Im2colB {
            map: Some(map),
            ..self
        }
        .with_taps(0, map.len())
    }

    /// The kernel tap of the view's tap `t` (`t < taps`).
    #[inline(always)]
    fn kernel_tap(&self, t: usize) -> usize {
        match self.map {
            Some(m) => m[self.tap0 + t],
            None => self.tap0 + t,
        }
    }

    /// Rows of one tap group.
    fn group_rows(&self) -> usize {
        self.rows / (self.taps / self.gw)
    }

    /// Group `q` of a grouped view as a view of its own (one group).
    fn group(&self, q: usize) -> Self {
        Im2colB {
            rows: self.group_rows(),
            tap0: self.tap0 + q * self.gw,
            taps: self.gw,
            ..*self
        }
    }

    /// Image and output position of the view's column `j` (counted from the view's first
    /// image on, i.e. `col0 + j`).
    #[inline(always)]
    fn locate(&self, j: usize) -> (usize, usize) {
        (j / self.wlen, self.wlo + j % self.wlen)
    }
}

impl PackB for Im2colB<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        if self.gw == self.taps {
            self.pack_rows(pc, kc, jc, nc, nr, dst, (kc, 0));
            return;
        }
        // Tap groups: each group's rows of the block packed by the group's own view, into
        // their rows of every micro-panel.
        let gr = self.group_rows();
        let mut p = pc;
        while p < pc + kc {
            let q = p / gr;
            let end = ((q + 1) * gr).min(pc + kc);
            self.group(q)
                .pack_rows(p - q * gr, end - p, jc, nc, nr, dst, (kc, p - pc));
            p = end;
        }
    }
    /// Stride-1 layers whose full panels are 16-value chunks (core-blas's [`ConvPack`] there).
    fn conv_fusable(&self, nr: usize) -> bool {
        self.fused
            && (self.src.d.stride[2] == 1 || (self.strided && self.src.d.stride[2] == 2))
            && nr.is_multiple_of(CHUNK_LANES)
            && nr <= 64
            && ConvPack::global().is_ok()
    }
    /// The full panel at `(pc, j)` as its cached chunks (per tap of the view) and the plane
    /// of its first row's channel in the panel's image: the rows [`PackB::pack_b`] would
    /// write with [`ConvPack::pack_rows`] (row `p` of the block is channel `(pc + p) / T`, tap
    /// `(pc + p) % T`). `None` for panels without chunks; the driver checks the rest (step-1
    /// single-piece chunks, every offset inside x).
    fn conv_panel(
        &self,
        pc: usize,
        kc: usize,
        j: usize,
        nr: usize,
        out: &mut ConvPanel,
    ) -> Option<&[f32]> {
        if !self.conv_fusable(nr) || kc == 0 || j + nr > self.cols {
            return None;
        }
        if self.gw != self.taps {
            // Tap groups: a block inside one group is that group's block.
            let gr = self.group_rows();
            let q = pc / gr;
            if (pc + kc - 1) / gr != q {
                return None;
            }
            // (The group's description reads x, as this view's would.)
            let src = self.src.x;
            return self
                .group(q)
                .conv_panel(pc - q * gr, kc, j, nr, out)
                .map(|_| src);
        }
        let src = &self.src;
        let (rl, nch) = (self.taps, nr / CHUNK_LANES);
        let first = self.col0 + j;
        let shift = self.locate(first).0 * src.image_len();
        self.with_scratch(nr, |sets| {
            let e = self.entry(sets, first, nr, nr, true);
            let s = &mut sets[0];
            if e.chunks == NO_CHUNKS {
                s.drop_entry(e);
                return None;
            }
            out.taps.clear();
            match self.map {
                Some(m) => {
                    for &kt in &m[self.tap0..][..rl] {
                        out.taps
                            .extend_from_slice(&s.chunks[e.chunks + kt * nch..][..nch]);
                    }
                }
                None => out
                    .taps
                    .extend_from_slice(&s.chunks[e.chunks + self.tap0 * nch..][..rl * nch]),
            }
            s.drop_entry(e);
            out.period = rl;
            out.first = pc % rl;
            out.base = isize::try_from(src.plane(pc / rl) + shift).ok()?;
            out.step = isize::try_from(src.plane(1) - src.plane(0)).ok()?;
            Some(src.x)
        })
    }
    /// Only for strided layers: on stride-1 layers the hints cost more than they save
    /// (probe, thread CPU time, min of 3-5 alternations, 09:46-09:49 UTC, forward without /
    /// with: ResNet-50 64@56² 0.98×, 128@28² 0.98×, 256@14² 0.96×, 512@7² 1.00×, VGG 0.97×,
    /// C3D 0.95×, ResNet-20's 16@32² 0.99×, 64@8² 0.98×, LeNet c2 0.95×), while ResNet-50's
    /// stride-2 128@56² runs 1.02× slower without them (ResNet-20's 16→32 stride 2: 0.97×).
    fn prefetch_b(&self, pc: usize, kc: usize, jc: usize, nc: usize) {
        if kc == 0 || nc == 0 || self.src.d.stride[2] == 1 || self.wlen != self.src.olen() {
            return;
        }
        let at = (self.col0 + jc) % self.wlen;
        if self.strided
            && let Some((width, nr)) = self.blocks
        {
            // Fused stride-2 panels with the driver's blocks known: the kernel's first tile
            // prefetches the next panel itself, so the panels that read x cold are each
            // block's first (of every pass: the next pass reads other channels) and the
            // partial panel at an image's end (packed by `pack_b` before its block's tiles).
            // The driver hints the next block (or pass) one slice per panel of this block,
            // in column order: the slice ending a block arrives in this block's last panel
            // (the one before the block it hints, for blocks as wide as this one), and stands
            // for that block's first panel; the slice reaching the image's end is also hinted
            // as it is (the partial panel). The other slices are dropped: the first panel
            // hinted a block ahead (the driver's first slice) is evicted by then.
            for (p, w) in block_hints(at, nc, self.wlen, width, nr)
                .into_iter()
                .flatten()
            {
                // (The view's column of image position p: jc is position at of its image.)
                self.prefetch_columns(pc, kc, jc - at + p, w);
            }
            return;
        }
        if self.strided && at != 0 && at + nc < self.wlen {
            // Fused stride-2 panels: the kernel's first tile prefetches the next panel itself
            // (the hints of every panel cost more than the phase copy they replace: quiet
            // 12:47:53 UTC, probe 17.75-17.90 ms with them, 17.34-17.85 without); only an
            // image's first panel (the next KC block's) and its last columns are hinted here.
            // The last columns are a partial panel on most layers (784 = 16 · 48 + 16 on
            // ResNet-50's 128@56² → 28²), which `pack_b` packs before the block's first tile
            // from x lines nothing else prefetched; the driver hints it in the last panel
            // before that block (perf: its packing 0.61 → 0.30% of the paired probe's samples).
            return;
        }
        let src = &self.src;
        PREFETCH_RUNS.with_borrow_mut(|runs| {
            src.runs(self.col0 + jc, nc, runs);
            src.prefetch(runs, self.channels(pc, kc), self.strided);
        });
    }
}

/// What a fused stride-2 view with the driver's column blocks known ([`Im2colB::with_block_hints`]:
/// blocks `width` columns wide from an image's first position, panels `nr` wide) hints for
/// the driver's slice of image positions `at..at + nc` (of `wlen`): the first panel of the
/// block the slice ends, when it ends one (or the image), and the slice itself when it
/// reaches the image's end from inside it (the partial panel `pack_b` packs up front); each
/// as (first position, positions).
fn block_hints(
    at: usize,
    nc: usize,
    wlen: usize,
    width: usize,
    nr: usize,
) -> [Option<(usize, usize)>; 2] {
    let end = at + nc;
    let own = (end >= wlen && at != 0).then_some((at, nc));
    let first = (end.is_multiple_of(width) || end >= wlen).then(|| {
        let first = (end - 1) / width * width;
        (first, nr.min(wlen - first))
    });
    [own, first]
}

impl Im2colB<'_> {
    /// Runs `f` on the thread's scratches, the one of this view's tables (geometry, panel
    /// width and window) first: the one kept for them, or else the least recently used one (or
    /// a new one, below [`SCRATCH_SETS`]) with its tables dropped and its slots made within
    /// [`PANEL_TABLE_BYTES`].
    fn with_scratch<R>(&self, nr: usize, f: impl FnOnce(&mut [Scratch]) -> R) -> R {
        let key = self.scratch_key(nr);
        SCRATCH.with_borrow_mut(|sets| {
            let found = sets.iter().position(|s| s.key == Some(key));
            let at = found.unwrap_or_else(|| {
                if sets.len() < SCRATCH_SETS {
                    sets.reserve_exact(SCRATCH_SETS - sets.len());
                    sets.push(Scratch::default());
                }
                let last = sets.len() - 1;
                let s = &mut sets[last];
                s.key = Some(key);
                s.slots.clear();
                s.clear_tables();
                last
            });
            sets[..=at].rotate_right(1);
            if found.is_none() {
                make_slots(sets, self.wlen);
            }
            f(sets)
        })
    }

    /// What the cached tables of a view depend on: the geometry, the group's first plane, the
    /// panel width and the window (not the view's taps: the tables cover every kernel tap).
    fn scratch_key(&self, nr: usize) -> (Dims3, [usize; 6]) {
        let src = &self.src;
        (
            src.d,
            [
                src.plane(0),
                src.image_len(),
                src.rlen,
                nr,
                self.wlo,
                self.wlen,
            ],
        )
    }

    /// The cached tables of the panel whose first column is `first` (`w` columns of a panel
    /// `nr` wide; full panels are cached per position in the window), built if missing;
    /// chunks only when `chunks` (core-blas's [`ConvPack`] is there) and `nr` is a multiple
    /// of 16.
    /// The entry is built in the first of `sets` (within [`PANEL_TABLE_BYTES`] for all of them:
    /// [`make_room`]); one not [`Entry::kept`] is for this panel only ([`Scratch::drop_entry`]
    /// once it is packed).
    fn entry(
        &self,
        sets: &mut [Scratch],
        first: usize,
        w: usize,
        nr: usize,
        chunks: bool,
    ) -> Entry {
        let src = &self.src;
        let stride = src.d.stride[2];
        let image = src.image_len();
        let n = self.locate(first).0;
        // Full panels are cached, in views whose slots fit.
        let cached = w == nr && !sets[0].slots.is_empty();
        let slot = if cached {
            sets[0].slots[first % self.wlen]
        } else {
            EMPTY
        };
        if slot != EMPTY {
            sets[0].entries[slot as usize]
        } else {
            // Runs: one per output line the panel touches in each stretch of the window it
            // covers (at most w / wlen + 2 stretches, each one more line than its length's).
            let o2 = src.d.output[2];
            let runs = w.min(w.div_ceil(o2) + 2 * (w.div_ceil(self.wlen) + 1));
            let need = Need {
                runs,
                segs: runs * src.rlen,
                taps: src.rlen,
                chunks: if cached && chunks {
                    src.rlen * nr / CHUNK_LANES
                } else {
                    0
                },
            };
            // A panel whose tables alone do not fit (kernels of thousands of taps) is built
            // anyway and given back once packed.
            let kept = make_room(sets, &need) && cached;
            let s = &mut sets[0];
            let e = Entry {
                runs: s.runs.len(),
                count: self.push_runs(first, w, &mut s.runs),
                segs: s.segs.len(),
                full: s.full.len(),
                lin: s.lin.len(),
                chunks: NO_CHUNKS,
                kept,
            };
            debug_assert!(e.count <= need.runs);
            src.push_segments(&s.runs[e.runs..], &mut s.segs);
            let (rr, ss) = (&s.runs[e.runs..], &mut s.segs[e.segs..]);
            // Relative to image n: a panel at `pos` of another image reads the same
            // segments that many images further on.
            for g in ss.iter_mut().filter(|g| g.hi > g.lo) {
                g.at -= n * image;
            }
            s.full.extend(
                ss.chunks_exact(e.count)
                    .map(|t| w == nr && t.iter().zip(rr).all(|(g, r)| g.lo == 0 && g.hi == r.len)),
            );
            let mut e = e;
            if kept && chunks {
                let at = s.chunks.len();
                if push_chunks(ss, rr, e.count, stride, nr, &mut s.chunks, &mut s.gidx) {
                    e.chunks = at;
                } else {
                    s.chunks.truncate(at);
                }
            }
            let fixed =
                w == nr && e.chunks == NO_CHUNKS && fixed_width(nr) && (stride == 1 || stride == 2);
            s.lin.extend(ss.chunks_exact(e.count).map(|t| {
                if fixed {
                    straight(t, rr, src.plane(1) - src.plane(0), stride, nr)
                } else {
                    Lin::default()
                }
            }));
            if kept {
                s.slots[first % self.wlen] = s.entries.len() as u32;
            }
            s.entries.push(e);
            e
        }
    }

    /// The runs of the view's columns `first..first + w` ([`Source::push_runs`] over the
    /// window's stretch of each image they cover), appended to `runs`; returns how many.
    fn push_runs(&self, first: usize, w: usize, runs: &mut Vec<Run>) -> usize {
        let (src, olen) = (&self.src, self.src.olen());
        if self.wlen == olen {
            return src.push_runs(first, w, runs);
        }
        let mut count = 0;
        let mut t = 0;
        while t < w {
            let (n, pos) = self.locate(first + t);
            let len = (w - t).min(self.wlo + self.wlen - pos);
            let at = runs.len();
            count += src.push_runs(n * olen + pos, len, runs);
            for r in &mut runs[at..] {
                r.start += t;
            }
            t += len;
        }
        count
    }

    /// [`PackB::pack_b`] for the panels `nr` wide of the rows `pc..pc + kc` (one tap group),
    /// written from row `roff` on of micro-panels `depth` rows deep.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn pack_rows(
        &self,
        pc: usize,
        kc: usize,
        jc: usize,
        nc: usize,
        nr: usize,
        dst: &mut [f32],
        (depth, roff): (usize, usize),
    ) {
        // The common panel widths as constants, so that a row's zero fill is a few vector
        // stores instead of a call into memset.
        match nr {
            16 => self.pack_panels(pc, kc, jc, nc, 16, dst, (depth, roff)),
            8 => self.pack_panels(pc, kc, jc, nc, 8, dst, (depth, roff)),
            32 => self.pack_panels(pc, kc, jc, nc, 32, dst, (depth, roff)),
            48 => self.pack_panels(pc, kc, jc, nc, 48, dst, (depth, roff)),
            _ => self.pack_panels(pc, kc, jc, nc, nr, dst, (depth, roff)),
        }
    }

    /// [`Im2colB::pack_rows`] for panels `nr` wide (inlined per constant `nr`).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn pack_panels(
        &self,
        pc: usize,
        kc: usize,
        jc: usize,
        nc: usize,
        nr: usize,
        dst: &mut [f32],
        (depth, roff): (usize, usize),
    ) {
        let src = &self.src;
        let stride = src.d.stride[2];
        let (image, rlen) = (src.image_len(), src.rlen);
        // Rows are (channel, tap of the view's window): `rl` per channel.
        let rl = self.taps;
        // Masked vector copies for full panels of 16-value chunks.
        let cp = ConvPack::global()
            .ok()
            .filter(|_| nr.is_multiple_of(CHUNK_LANES) && nr <= 64);
        let nch = nr / CHUNK_LANES;
        // The block rows' last (largest) plane, for the debug builds' bounds check.
        let planes = [src.plane((pc + kc).saturating_sub(1) / rl)];
        self.with_scratch(nr, |sets| {
            for (j0, w, panel) in micro_panels(dst, depth, nr, jc, nc) {
                let panel = &mut panel[roff * nr..][..kc * nr];
                let first = self.col0 + j0;
                let n = self.locate(first).0;
                let e = self.entry(sets, first, w, nr, cp.is_some());
                let s = &sets[0];
                let count = e.count;
                let prun = &s.runs[e.runs..][..count];
                let psegs = &s.segs[e.segs..][..count * rlen];
                let pfull = &s.full[e.full..][..rlen];
                let plin = &s.lin[e.lin..][..rlen];
                let shift = n * image;
                debug_assert!(src.segments_in_bounds(prun, psegs, &planes, shift));
                // By blocks of channels ([`channel_block`]: usually one), tap by tap (the rows
                // of one tap, one per channel, share its segments), the channels of the block
                // in order: row `c·T + tap − pc` (T = `rl`, the taps of the view).
                let ilen = src.plane(1) - src.plane(0);
                let (c_first, last) = (pc / rl, pc + kc - 1);
                let c_end = last / rl + 1;
                let chb = channel_block(c_end - c_first, ilen * size_of::<f32>());
                for (tap, b0) in (c_first..c_end)
                    .step_by(chb)
                    .flat_map(|b0| (0..rl).map(move |tap| (tap, b0)))
                {
                    let c_lo = (c_first + usize::from(tap < pc % rl)).max(b0);
                    if c_lo * rl + tap > last || c_lo >= b0 + chb {
                        continue;
                    }
                    let rows = ((last - tap) / rl + 1).min(b0 + chb) - c_lo;
                    // The tables are indexed by the kernel's tap.
                    let kt = self.kernel_tap(tap);
                    let tsegs = &psegs[kt * count..][..count];
                    let row0 = c_lo * rl + tap - pc;
                    debug_assert!((row0 + (rows - 1) * rl) < kc);
                    let from0 = src.plane(c_lo) + shift;
                    if let (Some(cp), true) = (cp, e.chunks != NO_CHUNKS) {
                        let chunks = &s.chunks[e.chunks + kt * nch..][..nch];
                        // SAFETY: rows `row0 + i·T < kc` of the panel (`kc · nr` values) hold
                        // `nr = 16 · nch` values each; the lanes a chunk reads are the
                        // segments' positions `at + t·stride` of the plane of channel `c_lo +
                        // i` of the panel's image (`push_chunks`), inside x like the segment
                        // copies below (checked in debug builds); gathers index `gidx`.
                        unsafe {
                            cp.pack_rows(
                                panel.as_mut_ptr().add(row0 * nr),
                                rl * nr,
                                rows,
                                src.x.as_ptr().add(from0),
                                ilen,
                                chunks,
                                &s.gidx,
                            );
                        }
                        continue;
                    }
                    let lin = plin[kt];
                    if lin.ok {
                        // One straight stretch of the plane: a fixed-size copy per channel,
                        // then the few padded positions zeroed.
                        let at = from0 + lin.base;
                        debug_assert!(at + (rows - 1) * ilen + stride * nr <= src.x.len());
                        for i in 0..rows {
                            // SAFETY: row `row0 + i·T < kc` of the panel (`kc · nr` values)
                            // holds `nr` (16, 32 or 48, `fixed_width`) values; `base + stride·nr`
                            // stays inside the plane of channel `c_lo + i` of the panel's image
                            // (`straight`), inside x; mask bits are below nr.
                            unsafe {
                                let d = panel.as_mut_ptr().add((row0 + i * rl) * nr);
                                let from = src.x.as_ptr().add(at + i * ilen);
                                if nr == 32 {
                                    copy_fixed::<32>(d, from, stride);
                                } else if nr == 48 {
                                    copy_fixed::<48>(d, from, stride);
                                } else {
                                    copy_fixed::<16>(d, from, stride);
                                }
                                let mut m = lin.mask;
                                while m != 0 {
                                    *d.add(m.trailing_zeros() as usize) = 0.0;
                                    m &= m - 1;
                                }
                            }
                        }
                        continue;
                    }
                    for i in 0..rows {
                        let out = &mut panel[(row0 + i * rl) * nr..][..nr];
                        if !pfull[kt] {
                            out.fill(0.0);
                        }
                        for (run, seg) in prun.iter().zip(tsegs) {
                            let len = seg.hi - seg.lo;
                            if len == 0 {
                                continue;
                            }
                            // SAFETY: runs tile `0..w` and `w <= nr = out.len()`; `lo <= hi <=
                            // run.len`; the source `plane + at + shift + t·stride`, `t < hi −
                            // lo`, lies in x (`segments` clips every run to the input, and the
                            // panel's images are in the batch; checked in debug builds).
                            unsafe {
                                let d = out.as_mut_ptr().add(run.start + seg.lo);
                                let from = src.x.as_ptr().add(from0 + i * ilen + seg.at);
                                copy_run(d, from, len, stride);
                            }
                        }
                    }
                }
                sets[0].drop_entry(e);
            }
        });
    }
}

/// Appends the [`Chunk`]s of every tap of a full `nr`-wide panel (`nr / 16` per tap) from its
/// segments `ss` (`count` per tap, tap-major, `at` relative to the panel's image) over the
/// panel's runs: lane `p` of a tap reads `at + t·stride` of its segment (`p = start + lo + t`),
/// the lanes of no segment are zero. `false` if a gather's offset does not fit an `i32`.
fn push_chunks(
    ss: &[Seg],
    runs: &[Run],
    count: usize,
    stride: usize,
    nr: usize,
    chunks: &mut Vec<Chunk>,
    gidx: &mut Vec<[i32; CHUNK_LANES]>,
) -> bool {
    let mut offs = [None::<isize>; 64];
    let offs = &mut offs[..nr];
    for t in ss.chunks_exact(count) {
        offs.fill(None);
        for (g, r) in t.iter().zip(runs) {
            for k in 0..g.hi.saturating_sub(g.lo) {
                offs[r.start + g.lo + k] = Some((g.at + k * stride) as isize);
            }
        }
        for lanes in offs.chunks_exact(CHUNK_LANES) {
            match Chunk::from_offsets(lanes, stride, gidx) {
                Some(c) => chunks.push(c),
                None => return false,
            }
        }
    }
    true
}

/// The [`Lin`] of one tap of a full `nr`-wide panel (stride 1 or 2) from its segments `t`
/// (`at` relative to the panel's image) over the panel's runs `runs`, in a plane of `ilen`
/// values: position `p` reads `base + stride·p`, and the copy reads `stride · nr` values.
fn straight(t: &[Seg], runs: &[Run], ilen: usize, stride: usize, nr: usize) -> Lin {
    let (mut base, mut mask) = (None, 0u64);
    for (g, r) in t.iter().zip(runs) {
        for p in (r.start..r.start + g.lo).chain(r.start + g.hi..r.start + r.len) {
            mask |= 1 << p;
        }
        if g.hi > g.lo {
            // Position `start + lo` reads `at`: the stretch starts `start + lo` positions
            // earlier.
            let b = g.at.checked_sub((r.start + g.lo) * stride);
            match (base, b) {
                (_, None) => return Lin::default(),
                (None, b) => base = b,
                (Some(x), Some(b)) if x != b => return Lin::default(),
                _ => {}
            }
        }
    }
    match base {
        Some(base) if base + stride * nr <= ilen => Lin {
            ok: true,
            base,
            mask,
        },
        _ => Lin::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::im2col::{im2col, im2col_shape};
    use crate::testing::uniform;
    use core_blas::Chunk;

    /// The value a [`ConvPanel`] description gives lane `l` of a row whose channel plane
    /// starts at `off` in `src` (`None` for a gather, which the driver packs with `pack_b`).
    fn described(c: Chunk, off: isize, l: usize, src: &[f32]) -> Option<f32> {
        let Chunk::Lines {
            step,
            m1,
            m2,
            off1,
            off2,
        } = c
        else {
            return None;
        };
        let bit = 1u16 << l;
        let s = isize::from(step) * l as isize;
        let at = if m1 & bit != 0 {
            off + off1 + s
        } else if m2 & bit != 0 {
            off + off2 + s
        } else {
            return Some(0.0);
        };
        Some(src[usize::try_from(at).expect("offset inside x")])
    }

    /// The fused stride-2 view's block hints: of the driver's slices of the next block (one
    /// per panel of the current block, in column order), the one ending a block stands for
    /// that block's first panel; the one reaching the image's end from inside it is also
    /// hinted as it is (the partial panel); every other slice is dropped. ResNet-50's 784
    /// positions in blocks of 336 (the last one 112 = 2 · 48 + 16), and 672 in blocks of 336
    /// (the last block full).
    #[test]
    fn block_hints_take_the_first_panel_of_each_block() {
        let h = |at, nc, wlen| block_hints(at, nc, wlen, 336, 48);
        for at in (0..288).step_by(48).chain((336..624).step_by(48)) {
            assert_eq!(h(at, 48, 784), [None, None], "{at}");
        }
        assert_eq!(h(288, 48, 784), [None, Some((0, 48))]);
        assert_eq!(h(624, 48, 784), [None, Some((336, 48))]);
        assert_eq!(h(672, 48, 784), [None, None]);
        assert_eq!(h(720, 48, 784), [None, None]);
        assert_eq!(h(768, 16, 784), [Some((768, 16)), Some((672, 48))]);
        assert_eq!(h(624, 48, 672), [Some((624, 48)), Some((336, 48))]);
        assert_eq!(h(288, 48, 672), [None, Some((0, 48))]);
        // A one-block image: its slice reaching the end from its start.
        assert_eq!(block_hints(0, 40, 40, 336, 48), [None, Some((0, 40))]);
    }

    /// A fused stride-2 view's hints (`lead`) also take the value before an input line whose
    /// run starts in the left padding (the step-2 tile's masked window touches its cache
    /// line: on row 0 the previous channel plane's last line), and nothing else is added:
    /// without `lead` the same indices but those. 3×3 stride 2 padding 1 on 2 × 3 × 11 × 12,
    /// the runs of a few column ranges, every channel.
    #[test]
    fn strided_hints_take_the_line_before_a_padded_run() {
        let g = ConvGeometry::new(2, 3, 4, &[11, 12], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        let x = uniform(5, g.x_len());
        let b = Im2colB::new(&g, 0, &x).with_strided_fusion();
        let (oh, ow) = (g.output()[0], g.output()[1]);
        let (h, w) = (g.input()[0], g.input()[1]);
        let src = &b.src;
        let mut runs = Vec::new();
        for (first, count) in [(0, 6), (3, 9), (ow, 2 * ow), (oh * ow, 8), (5, oh * ow)] {
            src.runs(first, count, &mut runs);
            let (mut with, mut without) = (Vec::new(), Vec::new());
            src.prefetch_indices(&runs, 0..3, true, |i| with.push(i));
            src.prefetch_indices(&runs, 0..3, false, |i| without.push(i));
            // The lines each run reads: taps' rows inside the image, from column 0 (a run
            // starting at output column 0 starts at input column -1).
            let mut lead = Vec::new();
            for p in (first..first + count).filter(|p| p % ow == 0) {
                let (n, oy) = (p / (oh * ow), p % (oh * ow) / ow);
                for c in 0..3 {
                    for kh in 0..3 {
                        let iy = (2 * oy + kh) as isize - 1;
                        if (0..h as isize).contains(&iy) {
                            let at = (n * 3 + c) * h * w + iy as usize * w;
                            if at > 0 {
                                lead.push(at - 1);
                            }
                        }
                    }
                }
            }
            assert_eq!(lead.is_empty(), (first..first + count).all(|p| p % ow != 0));
            let mut rest: Vec<usize> = with.clone();
            for i in &lead {
                let k = rest
                    .iter()
                    .position(|j| j == i)
                    .unwrap_or_else(|| panic!("{first} {count}: {i} not hinted"));
                rest.remove(k);
            }
            rest.sort_unstable();
            without.sort_unstable();
            assert_eq!(rest, without, "{first} {count}");
        }
    }

    /// A tap map combined with tap ranges and tap groups (and one group's own view, which
    /// `pack_b` and `conv_panel` use for blocks of a grouped view) packs the im2col rows of the
    /// map's entries: every block of several depths (blocks that cross groups included) and
    /// panel widths against the explicit im2col matrix, and every full panel `conv_panel`
    /// describes lane by lane. Before the map composed, a group's view read the map from its
    /// start whatever its first tap, so groups after the first packed the first group's taps.
    #[test]
    fn tap_maps_compose_with_tap_ranges_and_groups() {
        let geoms = [
            // Stride 1, padding 1: full panels fusable on AVX-512.
            (
                ConvGeometry::new(2, 5, 4, &[7, 9], &[3, 3])
                    .unwrap()
                    .with_padding(&[1, 1]),
                0,
            ),
            (
                ConvGeometry::new(1, 6, 4, &[9, 8], &[3, 3])
                    .unwrap()
                    .with_padding_per_side(&[2, 0], &[1, 2])
                    .unwrap()
                    .with_dilation(&[2, 1])
                    .unwrap()
                    .with_groups(2),
                1,
            ),
            (
                ConvGeometry::new(2, 3, 3, &[4, 5, 6], &[2, 3, 3])
                    .unwrap()
                    .with_padding(&[1, 1, 0]),
                0,
            ),
        ];
        let mut described_panels = 0;
        for (gi, (g, grp)) in geoms.into_iter().enumerate() {
            let g = g.unwrap();
            let x = uniform(gi as u64 + 7, g.x_len());
            let (rows, cols) = im2col_shape(&g);
            let mut col = vec![0.0; rows * cols];
            im2col(&g, grp, &x, &mut col).unwrap();
            let (cg, rlen) = (g.in_channels_per_group(), g.kernel_len());
            // Kernel taps out of order, one twice.
            let map: Vec<usize> = [rlen - 1, 0, 4, 2, rlen / 2, 1, 4]
                .into_iter()
                .map(|t| t % rlen)
                .collect();
            let mapped = Im2colB::new(&g, grp, &x)
                .with_fused_packing()
                .with_tap_map(&map);
            // (view, its first map entry, groups, group width)
            let views = [
                (mapped, 0, 1, map.len()),
                (mapped.with_taps(1, 4), 1, 1, 4),
                (mapped.with_tap_groups(0, 3, 2), 0, 3, 2),
                (mapped.with_tap_groups(1, 2, 3), 1, 2, 3),
                (mapped.with_tap_groups(2, 5, 1), 2, 5, 1),
            ];
            for (vi, (b, e0, groups, gw)) in views.into_iter().enumerate() {
                assert_eq!(b.rows(), cg * groups * gw);
                // Row `p` of the view: group `q`, channel `c`, tap `t` of the group.
                let want = |p: usize, j: usize| {
                    let (q, r) = (p / (cg * gw), p % (cg * gw));
                    let (c, t) = (r / gw, r % gw);
                    col[(c * rlen + map[e0 + q * gw + t]) * cols + j]
                };
                for nr in [8, 16, 32, 48] {
                    for kc in [1, 2, 3, 5, b.rows()] {
                        for pc in (0..b.rows()).step_by(kc) {
                            let kc = kc.min(b.rows() - pc);
                            let mut dst = vec![f32::NAN; cols.div_ceil(nr) * nr * kc];
                            b.pack_b(pc, kc, 0, cols, nr, &mut dst);
                            for (i, v) in dst.iter().enumerate() {
                                let (panel, p, l) = (i / (kc * nr), i / nr % kc, i % nr);
                                let j = panel * nr + l;
                                let w = if j < cols { want(pc + p, j) } else { 0.0 };
                                assert_eq!(
                                    *v, w,
                                    "geometry {gi} view {vi} nr {nr} rows {pc}+{kc} column {j}"
                                );
                            }
                            let mut out = ConvPanel::default();
                            for j in (0..cols / nr * nr).step_by(nr) {
                                let Some(src) = b.conv_panel(pc, kc, j, nr, &mut out) else {
                                    continue;
                                };
                                let nch = nr / CHUNK_LANES;
                                described_panels += 1;
                                for p in 0..kc {
                                    let t = (out.first + p) % out.period;
                                    let off = out.base
                                        + ((out.first + p) / out.period) as isize * out.step;
                                    for l in 0..nr {
                                        let c = out.taps[t * nch + l / CHUNK_LANES];
                                        if let Some(v) = described(c, off, l % CHUNK_LANES, src) {
                                            assert_eq!(
                                                v,
                                                want(pc + p, j + l),
                                                "geometry {gi} view {vi} conv_panel nr {nr} \
                                                 rows {pc}+{kc} column {}",
                                                j + l
                                            );
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        // Where core-blas packs chunks (AVX-512, AVX2), the stride-1 geometries' full panels
        // are described.
        assert_eq!(described_panels > 0, ConvPack::global().is_ok());
    }

    /// Views whose tables differ (windows of other output rows, another geometry, another
    /// panel width), more of them than a thread keeps scratches for, packed in turns on one
    /// thread: every full and partial panel against the explicit im2col matrix, so that a
    /// scratch handed to another view with the old view's tables, or a kept one whose tables
    /// were dropped or mixed up, fails.
    #[test]
    fn views_in_turns_keep_their_own_tables() {
        let g1 = ConvGeometry::new(3, 4, 2, &[9, 11], &[3, 3])
            .unwrap()
            .with_padding(&[1, 1])
            .unwrap();
        let g2 = ConvGeometry::new(2, 3, 2, &[6, 7], &[3, 2])
            .unwrap()
            .with_padding(&[1, 0])
            .unwrap();
        let (x1, x2) = (uniform(3, g1.x_len()), uniform(4, g2.x_len()));
        let dense = |g: &ConvGeometry, x: &[f32]| {
            let (rows, cols) = im2col_shape(g);
            let mut col = vec![0.0; rows * cols];
            im2col(g, 0, x, &mut col).unwrap();
            (col, cols)
        };
        let (c1, n1) = dense(&g1, &x1);
        let (c2, n2) = dense(&g2, &x2);
        let ow1 = g1.output()[1];
        // (view, its im2col, im2col's columns, the view's window (first, length), nr)
        let base1 = Im2colB::new(&g1, 0, &x1).with_fused_packing();
        let views = [
            (base1, &c1, n1, (0, 9 * ow1), 16),
            (base1.with_window(0, ow1), &c1, n1, (0, ow1), 16),
            (base1.with_window(ow1, 7 * ow1), &c1, n1, (ow1, 7 * ow1), 16),
            (base1.with_window(8 * ow1, ow1), &c1, n1, (8 * ow1, ow1), 16),
            (base1.with_window(ow1, 7 * ow1), &c1, n1, (ow1, 7 * ow1), 8),
            (
                Im2colB::new(&g2, 0, &x2),
                &c2,
                n2,
                (0, g2.output_spatial_len()),
                16,
            ),
        ];
        for round in 0..3 {
            for (vi, (b, col, n, (wlo, wlen), nr)) in views.iter().enumerate().rev() {
                let (rows, cols) = (b.rows(), b.cols());
                let olen = n / (cols / wlen);
                for pc in (0..rows).step_by(7) {
                    let kc = 7.min(rows - pc);
                    let mut dst = vec![f32::NAN; cols.div_ceil(*nr) * nr * kc];
                    b.pack_b(pc, kc, 0, cols, *nr, &mut dst);
                    for (i, v) in dst.iter().enumerate() {
                        let (panel, p, l) = (i / (kc * nr), i / nr % kc, i % nr);
                        let j = panel * nr + l;
                        let want = if j < cols {
                            col[(pc + p) * n + j / wlen * olen + wlo + j % wlen]
                        } else {
                            0.0
                        };
                        assert_eq!(
                            *v, want,
                            "round {round} view {vi} rows {pc}+{kc} column {j}"
                        );
                    }
                }
            }
        }
    }
}
