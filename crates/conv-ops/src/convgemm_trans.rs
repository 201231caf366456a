//! Transposed convgemm (`cgt`): the weight gradient dW = dY · im2col(x)ᵀ with im2col(x)ᵀ packed
//! straight from x (the convgemm paper's Fig. 10), so no workspace grows with the batch.
//!
//! Row `p` of B = im2col(x)ᵀ is (image, output position), column `j` is (channel, kernel tap).
//! The rows of a packed block are cut into runs once per call and a (tap × run) segment table
//! is built (see `source.rs`). Runs that are consecutive lines of one image read one straight
//! stretch of every channel plane when the input line is exactly one output line long (stride 1,
//! "same" padding), so such runs are grouped. On groups of at least `SHORT_RUN` outputs each
//! micro-panel is written group by group, whole `nr`-wide panel rows at a time: every lane (one
//! channel and tap) reads the input along the group from where its stretch starts, padding
//! included, so a group is a transpose of `nr` input runs into the panel (core-blas's
//! `transpose_lanes`, vectorised for stride 1), and the positions where a lane falls into the
//! padding are zeroed afterwards. Shorter groups are packed lane by lane, a strided copy per
//! (lane, run).
//!
//! Small output planes (at most [`SMALL_PLANE`] positions) and strided layers instead take
//! core-blas's [`ConvPack::pack_transposed`]: a [`Chunk`] per (16 rows, tap) says how 16
//! consecutive positions read a channel plane (masked loads, padding never read); 16 columns'
//! chunks are loaded and transposed in registers. The chunks of 16 rows depend only on the
//! position of the first row in its image: they are built once per layer and thread for every
//! position of an image, relative to image 0 (a table of O · R chunks, whatever the batch), and
//! each block's chunks are copied from the table with its images' offsets added.

use std::cell::RefCell;

use core_blas::{CHUNK_LANES, Chunk, ConvPack, PackB};

use crate::bytes_of;
use crate::geometry::{ConvGeometry, Dims3};
use crate::source::{Run, Seg, Source, micro_panels};

/// im2col(x)ᵀ of one group as a virtual `(N·O) × (C/G·R)` matrix that packs itself.
#[derive(Clone, Copy, Debug)]
pub struct Im2colTB<'a> {
    src: Source<'a>,
    rows: usize,
    cols: usize,
}

/// Runs shorter than this are packed lane by lane (the transpose's per-run setup costs more
/// than it saves on them).
const SHORT_RUN: usize = 12;

/// The widest micro-panel the transposing path takes (wider ones are packed lane by lane):
/// AVX-512's 32, or 48 for an 8×48 GEMM tile.
const MAX_LANES: usize = 48;

/// The most chunks cached per thread (24 bytes each): a layer whose table needs more (`O · R`:
/// one per output position of an image and tap) keeps the transposing copies below. The GEMM
/// packs every `(pc, kc)` block of B once per column block, and blocks at the same positions
/// of other images read the same chunks shifted, so the table is built once per layer.
const CACHE_MAX_CHUNKS: usize = 1 << 16;

/// Output planes of at most this many positions (and every strided layer) are packed from the
/// cached chunks; larger stride-1 planes keep the transposing copies of long straight stretches
/// (level with the chunks on ResNet-50's 64@56² and C3D: probe, 6 alternations, quiet
/// 00:38 UTC, min 0.90 / 0.97, median 1.04 / 1.05).
const SMALL_PLANE: usize = 1024;

#[derive(Default)]
struct Scratch {
    runs: Vec<Run>,
    segs: Vec<Seg>,
    /// Per lane of the panel being packed: (channel plane offset, tap).
    lanes: Vec<(usize, usize)>,
    /// Zeros that lanes reading nothing point to.
    zeros: Vec<f32>,
    /// Runs `a..b` transposed together (consecutive lines of one straight stretch).
    groups: Vec<(usize, usize)>,
    /// The geometry (dims, image and plane length) the table below belongs to.
    key: Option<(Dims3, usize, usize)>,
    /// Per output position `s` of an image and tap (`[s·R + tap]`), the [`Chunk`] reading the 16
    /// rows from `s` (in image 0, and on into image 1) from a channel plane; empty when the
    /// layer is not cached. `built[s]`: whether position `s` is in the table (not when its 16
    /// rows pass the end of the batch it was built for, or a gather's offset does not fit).
    table: Vec<Chunk>,
    built: Vec<bool>,
    /// The table's gathers' index rows.
    gidx: Vec<[i32; CHUNK_LANES]>,
    /// The chunks of the block being packed (`[q·R + tap]` for its 16-row blocks `q`): copied
    /// from the table with the block's images' offsets added, or built for the block's last
    /// rows; their gathers' index rows.
    block: Vec<Chunk>,
    block_idx: Vec<[i32; CHUNK_LANES]>,
    /// Per-row offsets of one tap; the runs and segments of 16 rows.
    offs: Vec<Option<isize>>,
    runs16: Vec<Run>,
    segs16: Vec<Seg>,
    /// Per column of the panel being packed: (plane offset, tap).
    cols: Vec<(isize, u32)>,
}

thread_local! {
    /// Runs, segments and lanes of the block being packed: no allocation in steady state.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl Scratch {
    /// Bytes the scratch holds: the capacities of its vectors.
    fn bytes(&self) -> usize {
        bytes_of(&self.runs)
            + bytes_of(&self.segs)
            + bytes_of(&self.lanes)
            + bytes_of(&self.zeros)
            + bytes_of(&self.groups)
            + bytes_of(&self.table)
            + bytes_of(&self.built)
            + bytes_of(&self.gidx)
            + bytes_of(&self.block)
            + bytes_of(&self.block_idx)
            + bytes_of(&self.offs)
            + bytes_of(&self.runs16)
            + bytes_of(&self.segs16)
            + bytes_of(&self.cols)
    }
}

/// Frees this thread's scratch, the chunk table included ([`crate::release_workspaces`]), and
/// returns its bytes; one in use counts 0.
pub(crate) fn release_thread() -> usize {
    crate::take_thread_buffer(&SCRATCH, |s| s.bytes())
}

impl<'a> Im2colTB<'a> {
    /// im2col(x)ᵀ of group `grp` (validated by the caller: `x.len() == g.x_len()`).
    pub fn new(g: &ConvGeometry, grp: usize, x: &'a [f32]) -> Self {
        Im2colTB {
            src: Source::new(g, grp, x),
            rows: g.batch() * g.output_spatial_len(),
            cols: g.in_channels_per_group() * g.kernel_len(),
        }
    }
}

impl PackB for Im2colTB<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        let src = &self.src;
        let stride = src.d.stride[2];
        SCRATCH.with_borrow_mut(|s| {
            let Scratch {
                runs,
                segs,
                lanes,
                zeros,
                groups,
                key,
                table,
                built,
                gidx,
                block,
                block_idx,
                offs,
                runs16,
                segs16,
                cols,
            } = s;
            // Room for the most runs a block can cross (a line each, and a partial one at each
            // end) at the deepest pass the GEMM runs (its KC, 4/3 deeper with several A blocks,
            // 9/8 deeper to save a pass: 3/2 KC), reserved whole: what the buffers keep then
            // depends on the layer only, not on the batch (the passes' depth follows N·O) nor
            // on which of its blocks crossed the most lines.
            let deepest = core_blas::Gemm::global()
                .map_or(kc, |g| g.block_sizes().kc * 3 / 2)
                .max(kc);
            let most_runs = deepest / src.d.output[2].max(1) + 2;
            runs.clear();
            runs.reserve_exact(most_runs);
            segs.clear();
            segs.reserve_exact(most_runs * src.rlen);
            src.runs(pc, kc, runs);
            src.segments(runs, segs);
            let count = runs.len();
            let rlen = src.rlen;
            let k = (src.d, src.image_len(), src.plane(1) - src.plane(0));
            let olen = src.olen();
            let small = olen <= SMALL_PLANE || stride != 1;
            if *key != Some(k) {
                *key = Some(k);
                table.clear();
                built.clear();
                gidx.clear();
                if small && olen * rlen <= CACHE_MAX_CHUNKS {
                    // Every position of an image at once: the table's size depends on the
                    // layer only (not on the batch, nor on which blocks the GEMM asks for).
                    table.reserve_exact(olen * rlen);
                    built.reserve_exact(olen);
                    for at in 0..olen {
                        let before = (table.len(), gidx.len());
                        let ok = at + CHUNK_LANES <= self.rows && {
                            src.runs(at, CHUNK_LANES, runs16);
                            src.segments(runs16, segs16);
                            push_chunks(src, runs16, segs16, CHUNK_LANES, table, gidx, offs)
                        };
                        if !ok {
                            table.truncate(before.0);
                            gidx.truncate(before.1);
                            table.resize(before.0 + rlen, Chunk::ZERO);
                        }
                        built.push(ok);
                    }
                    gidx.shrink_to_fit();
                }
            }
            let cached = !table.is_empty()
                && block_chunks(
                    src,
                    (pc, kc, deepest),
                    self.rows,
                    (table, built, gidx),
                    (block, block_idx),
                    offs,
                    (runs16, segs16),
                );
            if let (Some(cp), true) = (
                ConvPack::global()
                    .ok()
                    .filter(|_| nr.is_multiple_of(CHUNK_LANES)),
                cached,
            ) {
                let chunks = &block[..kc.div_ceil(CHUNK_LANES) * rlen];
                let gidx: &[[i32; CHUNK_LANES]] = block_idx;
                for (j0, w, panel) in micro_panels(dst, kc, nr, jc, nc) {
                    debug_assert!({
                        let planes: Vec<usize> =
                            (j0..j0 + w).map(|j| src.plane(j / rlen)).collect();
                        src.segments_in_bounds(runs, segs, &planes, 0)
                    });
                    debug_assert!(panel.len() >= kc * nr);
                    cols.clear();
                    cols.extend(
                        (j0..j0 + w).map(|j| (src.plane(j / rlen) as isize, (j % rlen) as u32)),
                    );
                    // SAFETY: the panel holds `kc · nr` values, `w <= nr`, `nr` a multiple of
                    // 16; `chunks` has R chunks per block of 16 rows of `kc`; the lanes a chunk
                    // reads are segment positions `plane + at + t·stride` inside x (`segments`
                    // clips every run to the input; checked in debug builds); gathers index
                    // `gidx`.
                    unsafe {
                        cp.pack_transposed(
                            panel.as_mut_ptr(),
                            nr,
                            kc,
                            src.x.as_ptr(),
                            cols,
                            chunks,
                            rlen,
                            gidx,
                        );
                    }
                }
                return;
            }
            let Ok(gemm) = core_blas::Gemm::global() else {
                pack_lanes(src, runs, segs, (jc, nc), kc, nr, dst);
                return;
            };
            // Consecutive lines of one image (and outer output coordinate) read one straight
            // stretch of each channel plane when the input line is as long as the output line
            // (stride 1): then a group of such runs is transposed in one go, its padded
            // positions zeroed afterwards.
            let straight = src.lines_are_straight();
            groups.clear();
            let mut i = 0;
            while i < count {
                let mut end = i + 1;
                while straight && end < count && src.next_line(&runs[end - 1], &runs[end]) {
                    end += 1;
                }
                groups.push((i, end));
                i = end;
            }
            let longest_group = groups
                .iter()
                .map(|&(a, b)| runs[b - 1].start + runs[b - 1].len - runs[a].start)
                .max()
                .unwrap_or(0);
            if longest_group < SHORT_RUN {
                pack_lanes(src, runs, segs, (jc, nc), kc, nr, dst);
                return;
            }
            let longest = (longest_group - 1) * stride + 1;
            if zeros.len() < longest {
                zeros.resize(longest, 0.0);
            }
            let zeros: &[f32] = zeros;
            let mut from: [&[f32]; MAX_LANES] = [&[]; MAX_LANES];
            for (j0, w, panel) in micro_panels(dst, kc, nr, jc, nc) {
                debug_assert!({
                    let planes: Vec<usize> =
                        (j0..j0 + w).map(|j| src.plane(j / src.rlen)).collect();
                    src.segments_in_bounds(runs, segs, &planes, 0)
                });
                debug_assert!(panel.len() >= kc * nr);
                lanes.clear();
                lanes.extend((j0..j0 + w).map(|col| (src.plane(col / src.rlen), col % src.rlen)));
                for &(g0, g1) in groups.iter() {
                    let start = runs[g0].start;
                    let len = runs[g1 - 1].start + runs[g1 - 1].len - start;
                    let rows = &mut panel[start * nr..][..len * nr];
                    // Each lane reads the whole group from where its first readable position
                    // would start it (the padding positions are zeroed afterwards) when that
                    // stays inside x; lanes that read nothing read zeros.
                    let need = (len - 1) * stride + 1;
                    let mut inside = len >= SHORT_RUN && nr <= MAX_LANES;
                    for (lane, from) in from.iter_mut().enumerate().take(nr) {
                        if !inside {
                            break;
                        }
                        if lane >= w {
                            *from = &zeros[..need];
                            continue;
                        }
                        let (plane, tap) = lanes[lane];
                        let tsegs = &segs[tap * count..][..count];
                        // The first run of the group that reads something fixes the stretch.
                        let first = (g0..g1).find(|&i| tsegs[i].hi > tsegs[i].lo);
                        let Some(i) = first else {
                            *from = &zeros[..need];
                            continue;
                        };
                        let seg = &tsegs[i];
                        // Every readable position of the group lies on that one stretch.
                        debug_assert!((g0..g1).all(|k| {
                            let (r, g) = (&runs[k], &tsegs[k]);
                            g.hi == g.lo
                                || g.at + (runs[i].start + seg.lo) * stride
                                    == seg.at + (r.start + g.lo) * stride
                        }));
                        match (plane + seg.at)
                            .checked_sub((runs[i].start - start + seg.lo) * stride)
                            .and_then(|first| src.x.get(first..first + need))
                        {
                            Some(lane_src) => *from = lane_src,
                            None => inside = false,
                        }
                    }
                    let copied = inside
                        && if stride == 1 {
                            gemm.transpose_lanes(rows, nr, &from[..nr], len, 1).is_ok()
                        } else {
                            // core-blas's strided transpose is scalar too: a row at a time.
                            let d = rows.as_mut_ptr();
                            for t in 0..len {
                                for (l, lane) in from[..nr].iter().enumerate() {
                                    // SAFETY: every lane holds `need = (len − 1)·stride + 1`
                                    // values (sliced above), so `t·stride`, `t < len`, is
                                    // inside it; row `t`, lane `l < nr` lie in `rows`.
                                    unsafe { *d.add(t * nr + l) = *lane.as_ptr().add(t * stride) };
                                }
                            }
                            true
                        };
                    for (run, i) in runs[g0..g1].iter().zip(g0..) {
                        let rows = &mut panel[run.start * nr..][..run.len * nr];
                        if copied {
                            for lane in 0..w {
                                let seg = &segs[lanes[lane].1 * count + i];
                                if seg.lo < seg.hi {
                                    for t in (0..seg.lo).chain(seg.hi..run.len) {
                                        rows[t * nr + lane] = 0.0;
                                    }
                                } else {
                                    // Nothing readable on this line: all padding.
                                    for t in 0..run.len {
                                        rows[t * nr + lane] = 0.0;
                                    }
                                }
                            }
                            continue;
                        }
                        for lane in 0..nr {
                            if lane >= w {
                                for t in 0..run.len {
                                    rows[t * nr + lane] = 0.0;
                                }
                                continue;
                            }
                            let (plane, tap) = lanes[lane];
                            let seg = &segs[tap * count + i];
                            // SAFETY: rows `t < run.len` and `lane < nr` keep writes inside
                            // `rows`; `lo <= hi <= run.len`; the source `plane + at +
                            // t·stride`, `t < hi − lo`, lies in x (`segments` clips every run
                            // to the input; checked in debug builds).
                            unsafe {
                                let d = rows.as_mut_ptr().add(lane);
                                for t in 0..seg.lo {
                                    *d.add(t * nr) = 0.0;
                                }
                                let from = src.x.as_ptr().add(plane + seg.at);
                                for t in 0..seg.hi - seg.lo {
                                    *d.add((seg.lo + t) * nr) = *from.add(t * stride);
                                }
                                for t in seg.hi..run.len {
                                    *d.add(t * nr) = 0.0;
                                }
                            }
                        }
                    }
                }
            }
        });
    }
}

/// The chunks of block `(pc, kc)` of the `rows` rows (passes at most `deepest` deep) into `block` (`[q·R + tap]`) and their
/// gathers' index rows into `idx`: each whole 16-row block `q` copied from the table at its
/// first row's position in its image `n`, its offsets moved by `n` images; the others (the
/// block's last rows, positions not in the table) built for their rows. `false` when an offset
/// does not fit (an `i32` gather index): the block is then packed without chunks.
#[allow(clippy::type_complexity)]
fn block_chunks(
    src: &Source<'_>,
    (pc, kc, deepest): (usize, usize, usize),
    rows: usize,
    (table, built, gidx): (&[Chunk], &[bool], &[[i32; CHUNK_LANES]]),
    (block, idx): (&mut Vec<Chunk>, &mut Vec<[i32; CHUNK_LANES]>),
    offs: &mut Vec<Option<isize>>,
    (runs, segs): (&mut Vec<Run>, &mut Vec<Seg>),
) -> bool {
    let (rlen, olen, image) = (src.rlen, src.olen(), src.image_len());
    block.clear();
    idx.clear();
    // At most one gather row per chunk: reserved whole for the deepest pass (`deepest >= kc`
    // rows), so that what the buffers keep does not depend on the batch.
    let most = deepest.div_ceil(CHUNK_LANES) * rlen;
    block.reserve_exact(most);
    idx.reserve_exact(most);
    for r0 in (pc..pc + kc).step_by(CHUNK_LANES) {
        let count = CHUNK_LANES.min(pc + kc - r0);
        let (n, at) = (r0 / olen, r0 % olen);
        if count == CHUNK_LANES && r0 + CHUNK_LANES <= rows && built[at] {
            let Ok(shift) = isize::try_from(n * image) else {
                return false;
            };
            for c in &table[at * rlen..][..rlen] {
                block.push(match *c {
                    Chunk::Lines {
                        step,
                        m1,
                        m2,
                        off1,
                        off2,
                    } => Chunk::Lines {
                        step,
                        m1,
                        m2,
                        off1: off1 + shift,
                        off2: off2 + shift,
                    },
                    Chunk::Gather { mask, at } => {
                        let mut row = gidx[at as usize];
                        for (l, v) in row.iter_mut().enumerate() {
                            if mask & (1 << l) != 0 {
                                match i32::try_from(*v as isize + shift) {
                                    Ok(x) => *v = x,
                                    Err(_) => return false,
                                }
                            }
                        }
                        idx.push(row);
                        Chunk::Gather {
                            mask,
                            at: (idx.len() - 1) as u32,
                        }
                    }
                });
            }
        } else {
            src.runs(r0, count, runs);
            src.segments(runs, segs);
            if !push_chunks(src, runs, segs, count, block, idx, offs) {
                return false;
            }
        }
    }
    true
}

/// Appends the chunks of the rows `0..kc` of a block (runs `runs`, segments `segs`, tap-major): for
/// each block of 16 rows and each tap, lane `p` reads `at + t·stride` of the segment holding
/// row `p` (relative to a channel plane), the rows of no segment zero. `false` when a gather's
/// offset does not fit an `i32`.
fn push_chunks(
    src: &Source<'_>,
    runs: &[Run],
    segs: &[Seg],
    kc: usize,
    chunks: &mut Vec<Chunk>,
    gidx: &mut Vec<[i32; CHUNK_LANES]>,
    offs: &mut Vec<Option<isize>>,
) -> bool {
    let (rlen, count, stride) = (src.rlen, runs.len(), src.d.stride[2]);
    let blocks = kc.div_ceil(CHUNK_LANES);
    let at = chunks.len();
    chunks.resize(at + blocks * rlen, Chunk::ZERO);
    offs.clear();
    offs.resize(blocks * CHUNK_LANES, None);
    for tap in 0..rlen {
        offs.fill(None);
        for (run, g) in runs.iter().zip(&segs[tap * count..][..count]) {
            for t in 0..g.hi.saturating_sub(g.lo) {
                offs[run.start + g.lo + t] = Some((g.at + t * stride) as isize);
            }
        }
        for (q, lanes) in offs.chunks_exact(CHUNK_LANES).enumerate() {
            match Chunk::from_offsets(lanes, stride, gidx) {
                Some(c) => chunks[at + q * rlen + tap] = c,
                None => return false,
            }
        }
    }
    true
}

/// The block lane by lane (one channel and tap at a time, every run), for lines shorter than
/// [`SHORT_RUN`].
fn pack_lanes(
    src: &Source<'_>,
    runs: &[Run],
    segs: &[Seg],
    (jc, nc): (usize, usize),
    kc: usize,
    nr: usize,
    dst: &mut [f32],
) {
    let stride = src.d.stride[2];
    let count = runs.len();
    for (j0, w, panel) in micro_panels(dst, kc, nr, jc, nc) {
        debug_assert!({
            let planes: Vec<usize> = (j0..j0 + w).map(|j| src.plane(j / src.rlen)).collect();
            src.segments_in_bounds(runs, segs, &planes, 0)
        });
        debug_assert!(panel.len() >= kc * nr);
        for lane in 0..nr {
            let base = panel.as_mut_ptr();
            if lane >= w {
                for p in 0..kc {
                    panel[p * nr + lane] = 0.0;
                }
                continue;
            }
            let col = j0 + lane;
            let (plane, tap) = (src.plane(col / src.rlen), col % src.rlen);
            for (run, seg) in runs.iter().zip(&segs[tap * count..][..count]) {
                // SAFETY: rows `run.start + t < kc` (runs tile `0..kc`) and `lane < nr` keep
                // writes inside the `kc·nr` panel; `lo <= hi <= run.len`; the source `plane +
                // at + t·stride`, `t < hi − lo`, lies in x (`segments` clips every run to the
                // input; checked in debug builds).
                unsafe {
                    let d = base.add(run.start * nr + lane);
                    for t in 0..seg.lo {
                        *d.add(t * nr) = 0.0;
                    }
                    let from = src.x.as_ptr().add(plane + seg.at);
                    for t in 0..seg.hi - seg.lo {
                        *d.add((seg.lo + t) * nr) = *from.add(t * stride);
                    }
                    for t in seg.hi..run.len {
                        *d.add(t * nr) = 0.0;
                    }
                }
            }
        }
    }
}

/// Test helper shared by this module's and [`crate::bf_blocked`]'s tests: the transposed
/// convgemm's backward-filter of `g` on pools of 1 and 2 threads against the reference.
#[cfg(test)]
pub(crate) fn check_against_reference_on_1_and_2_threads(g: &ConvGeometry) {
    use crate::testing::{Tolerance, uniform};
    use crate::{BackwardFilterAlgo, Workspace, backward_filter, reference};
    let (x, dy) = (uniform(4, g.x_len()), uniform(5, g.y_len()));
    let mut want = vec![0f32; g.w_len()];
    reference::backward_filter(g, &x, &dy, &mut want).unwrap();
    for threads in 1..=2 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut dw = vec![f32::NAN; g.w_len()];
        pool.install(|| {
            backward_filter(
                g,
                &x,
                &dy,
                &mut dw,
                BackwardFilterAlgo::ConvgemmTrans,
                &mut Workspace::new(false),
            )
        })
        .unwrap();
        Tolerance::for_f32_sum(g.batch() * g.output_spatial_len())
            .check(&format!("{g:?} {threads} threads"), &dw, &want)
            .unwrap();
    }
}

#[cfg(test)]
mod tests {
    use crate::ConvGeometry;

    /// Lines of at least [`super::SHORT_RUN`] outputs (the transposing packer): strides 1-3,
    /// padding on either side (lanes that start or end in the padding, runs at the very start
    /// and end of x that fall back to lane-by-lane copies), dilation, groups, 1-3 spatial
    /// dimensions, channel × tap counts that leave the last micro-panel partly empty; on 1 and
    /// 2 threads, against the reference.
    #[test]
    fn wide_lines_match_the_reference() {
        let geoms = [
            ConvGeometry::new(3, 5, 4, &[40], &[3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(2, 6, 4, &[9, 61], &[3, 5])
                .unwrap()
                .with_stride(&[1, 2])
                .unwrap()
                .with_padding_per_side(&[2, 0], &[1, 2])
                .unwrap()
                .with_groups(2)
                .unwrap(),
            ConvGeometry::new(2, 3, 5, &[7, 50], &[2, 3])
                .unwrap()
                .with_stride(&[1, 3])
                .unwrap()
                .with_dilation(&[1, 2])
                .unwrap()
                .with_padding(&[2])
                .unwrap(),
            ConvGeometry::new(1, 4, 3, &[3, 4, 20], &[2, 3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(2, 7, 6, &[5, 33], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
        ];
        for g in &geoms {
            assert!(g.output()[g.rank() - 1] >= super::SHORT_RUN, "{g:?}");
            super::check_against_reference_on_1_and_2_threads(g);
        }
    }
}
