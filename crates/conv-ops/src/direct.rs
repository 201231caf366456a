//! Direct convolution for layers with few channels (the forward pass, and through
//! [`crate::flipped`] the stride-1 backward-data pass): no GEMM, no packed B.
//!
//! The GEMM forms (convgemm) spend, on 16-64-channel layers, as much time packing im2col(x) as
//! multiplying: every packed B value feeds only K/G multiply-adds. This module reads x in place
//! instead. Per image and group, x is first copied once into a zero-padded, *polyphase* buffer
//! `xq` (for stride s each dimension is split into its s phases, so that a stride-s read becomes
//! a unit-stride one): channel c, phase (pd, ph, pw), position (i, j, l) of the phase plane holds
//! padded-x\[c\]\[i·sd + pd\]\[j·sh + ph\]\[l·sw + pw\]. Output pixel o of dimension d with tap r
//! then reads phase (r·dil) mod s at index o + (r·dil) div s: for every (input channel, tap) step
//! one *offset* into `xq`, and for every run of 8 consecutive outputs along the last dimension one
//! *base*, so that the 8 input values of a step are one unaligned vector load at
//! `xq[base + offset]`.
//!
//! The register tile is [`MR`] output channels × up to 6 vectors of 8 output pixels (the
//! vectors may lie on different output lines): per step one vector load of x per run, [`MR`]
//! broadcasts of packed weights, one FMA per channel and run into accumulators that hold output
//! pixels, stored straight into y's planes (bias, ReLU in the epilogue). The tile is
//! core-blas's [`core_blas::offset_tile`] (the process-wide kernel family: AVX2+FMA here, the
//! portable body under `CORE_BLAS_ISA=scalar`); on the AVX-512 family its wide tile
//! ([`core_blas::Gemm::offset_wide_tile`]: [`WIDE_MR`] (8) channels × up to 4 vectors of 16
//! pixels, [`channel_lanes`]), the forward plan's runs then 16 lanes wide (flat runs over up to
//! three output lines where lines are shorter); so this module holds no intrinsics.
//!
//! From 128 output channels per group on (images whose padded copy fits half of L2), the
//! forward uses *pixel tiles* instead ([`Tiles::Pixels`]): 6 output pixels at any bases (x
//! values broadcast; tiles cross lines and images of a block of images) × 16 output channels of
//! a packed Wᵀ panel (AVX-512: 12 × 32), core-blas's [`core_blas::offset_a_store`] (the
//! "offset-A" tile, a GEMM tile with A read in place, its shape core-blas's
//! [`core_blas::Gemm::offset_a_shape`]), stored transposed into y: no lane lost where output
//! lines are not a multiple of 8 wide (ResNet-50's 28-, 14- and 7-wide lines).
//!
//! Workspace: per thread, the polyphase copy of one image's group (C/G × padded plane floats;
//! pixel tiles: of a block of images, at most [`PIXEL_BLOCK_BYTES`] unless one image is larger)
//! and the packed weights of the call (K × C/G × R floats; pixel tiles: K rounded up to 16, in
//! the calling thread's storage), kept in thread-local storage across calls; nothing grows with
//! the batch.

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use core_blas::{
    AlignedVec, DOT_MR, Gemm, OFFSET_LANES, OFFSET_MR, OffsetAStore, OffsetTile, Offsets,
    WIDE_LANES, WIDE_MR, WideTile,
};

use crate::error::{ConvError, Result, gemm_err};
use crate::geometry::{ConvGeometry, MAX_RANK};
use Weights::{Flipped, Plain};

/// Output channels per register tile.
pub(crate) const MR: usize = OFFSET_MR;

/// Output runs per band: the loop over output-channel blocks runs inside a band, so that the
/// band's input lines are read from cache by every block (a multiple of every
/// [`runs_per_tile`]).
const BAND: usize = 24;

/// Runs (vectors of output pixels) per tile for a block of `m` output channels (core-blas's
/// [`core_blas::offset_tile_vectors`]: 2 runs for 4-6 channels, up to 6 for one).
pub(crate) const fn runs_per_tile(m: usize) -> usize {
    core_blas::offset_tile_vectors(m)
}

/// The output channels of a group split into blocks of at most `mr` (the tile's rows: [`MR`],
/// or [`WIDE_MR`] on the wide tile), as even as possible (32 at 6 → 6, 6, 5, 5, 5, 5 rather
/// than 6 × 5 + 2): `(first channel, channels)` per block.
fn channel_blocks(kg: usize, mr: usize) -> Vec<(usize, usize)> {
    let nb = kg.div_ceil(mr);
    let (base, extra) = (kg / nb, kg % nb);
    let mut k0 = 0;
    (0..nb)
        .map(|i| {
            let m = base + usize::from(i < extra);
            k0 += m;
            (k0 - m, m)
        })
        .collect()
}
/// Output pixels per vector (one AVX register of f32).
pub(crate) const LANES: usize = OFFSET_LANES;

/// One run of the plan's lanes ([`LANES`], or [`WIDE_LANES`] on the wide tile): at most that
/// many consecutive outputs along the last dimension (per-line runs), or, in a *flat* plan, as
/// many consecutive positions of the output lines laid out at the phase plane's line pitch,
/// whose lanes past an output line's end are computed and dropped (see [`Plan::with_layout`]).
#[derive(Debug, Clone, Copy)]
struct PixelRun {
    /// Offset of lane 0's first input (tap 0, channel 0) in the polyphase buffer.
    src: usize,
    /// Offset of its first output in an output plane.
    dst: usize,
    /// Outputs in the run, 1..=lanes (back to back in the output plane).
    len: usize,
    /// The lanes holding the outputs (bit l: lane l), `len` of them, in output order; the
    /// lowest `len` bits for a run of one piece from lane 0.
    mask: u32,
}

impl PixelRun {
    /// A run of `len` outputs from lane 0, one piece.
    fn line(src: usize, dst: usize, len: usize) -> PixelRun {
        PixelRun {
            src,
            dst,
            len,
            mask: low_lanes(len),
        }
    }

    /// Whether the outputs are the lowest `len` lanes (one piece from lane 0).
    fn one_piece(&self) -> bool {
        self.mask == low_lanes(self.len)
    }
}

/// The mask of lanes `0..n` (`n` <= 32).
const fn low_lanes(n: usize) -> u32 {
    if n >= 32 { u32::MAX } else { (1u32 << n) - 1 }
}

/// Everything about a geometry the kernel loops need, independent of the image and group.
#[derive(Debug)]
struct Plan {
    /// Lanes per run: [`LANES`], or [`WIDE_LANES`] for the wide tile's forward plans.
    lanes: usize,
    /// Floats of one channel in the polyphase buffer (all phases).
    chan: usize,
    /// Polyphase buffer length for one group of one image (plus [`LANES`] of slack for the
    /// loads of a partial run).
    xq_len: usize,
    /// Per step (input channel of the group, tap): offset into the polyphase buffer.
    offs: Offsets,
    /// Taps per input channel (steps = C/G · taps).
    taps: usize,
    /// The output runs of one image.
    runs: Vec<PixelRun>,
    /// Which phases of the last dimension some tap reads (the others are left zero).
    phase_read: Vec<bool>,
    /// Right-aligned input extents, padding before, strides and phase-plane extents.
    input: [usize; MAX_RANK],
    pad: [usize; MAX_RANK],
    stride: [usize; MAX_RANK],
    q: [usize; MAX_RANK],
}

impl Plan {
    /// The plan of the backward-filter pass: per-line runs.
    fn new(g: &ConvGeometry) -> Result<Plan> {
        Plan::with_layout(g, false, LANES)
    }

    /// The plan of the forward pass on runs of `lanes` values: flat runs where they need
    /// fewer runs than per-line ones (see [`flat_line_pitch_for`]), per-line runs otherwise.
    fn forward(g: &ConvGeometry, lanes: usize) -> Result<Plan> {
        Plan::with_layout(g, flat_line_pitch_for(g, lanes).is_some(), lanes)
    }

    /// With `flat`, the phase planes' lines are [`flat_line_pitch`] values apart and the runs
    /// cover the output lines of each output slice laid out at that pitch ([`LANES`]
    /// consecutive positions per run, the positions past a line's end computed and dropped):
    /// a valid output reads at most `min(pad before, pad after) − 1` values past its line's
    /// pitch, into the next line's zero padding before its first input. Without, lines of
    /// [`ALIGN_FROM`]+ values are padded to a multiple of [`LANES`] and each output line is cut
    /// into its own runs.
    fn with_layout(g: &ConvGeometry, flat: bool, lanes: usize) -> Result<Plan> {
        let d = g.dims3();
        let mut q = [0usize; MAX_RANK];
        for i in 0..MAX_RANK {
            let padded = d.input[i] + d.pad[i] + pad_after3(g)[i];
            q[i] = padded.div_ceil(d.stride[i]);
        }
        let flat = flat.then(|| flat_line_pitch_for(g, lanes)).flatten();
        if let Some(pitch) = flat {
            q[MAX_RANK - 1] = pitch;
        } else if q[MAX_RANK - 1] >= ALIGN_FROM {
            // Lines of ALIGN_FROM+ values start on 32-byte boundaries (see [`ALIGN_FROM`]).
            q[MAX_RANK - 1] = q[MAX_RANK - 1].next_multiple_of(LANES);
        }
        let sub = q[0] * q[1] * q[2];
        let phases = d.stride[0] * d.stride[1] * d.stride[2];
        let chan = sub * phases;
        let cg = g.in_channels_per_group();
        // Whole 64-byte lines, so that copies side by side start on a line as the first does.
        // Slack after the last channel: a partial run's lanes (per-line), or a flat run's
        // dropped lanes (up to a line past the last output).
        let slack = if flat.is_some() {
            lanes + q[MAX_RANK - 1]
        } else {
            lanes
        };
        let xq_len = cg
            .checked_mul(chan)
            .and_then(|v| v.checked_add(slack))
            .and_then(|v| v.checked_next_multiple_of(16))
            .ok_or(ConvError::Overflow {
                field: "direct convolution's padded input",
            })?;
        // Offset of every tap inside one channel's polyphase block.
        let mut taps = Vec::with_capacity(g.kernel_len());
        for rd in 0..d.kernel[0] {
            for rh in 0..d.kernel[1] {
                for rw in 0..d.kernel[2] {
                    let r = [rd, rh, rw];
                    let (mut phase, mut at) = (0, 0);
                    for i in 0..MAX_RANK {
                        let reach = r[i] * d.dilation[i];
                        phase = phase * d.stride[i] + reach % d.stride[i];
                        at = at * q[i] + reach / d.stride[i];
                    }
                    taps.push(phase * sub + at);
                }
            }
        }
        let offs: Vec<usize> = (0..cg)
            .flat_map(|c| taps.iter().map(move |&t| c * chan + t))
            .collect();
        let o = d.output;
        let runs = match flat {
            Some(pitch) => flat_runs(o, q, pitch, lanes),
            None => {
                let mut runs = Vec::with_capacity(o[0] * o[1] * o[2].div_ceil(lanes));
                for od in 0..o[0] {
                    for oh in 0..o[1] {
                        for ow in (0..o[2]).step_by(lanes) {
                            runs.push(PixelRun::line(
                                (od * q[1] + oh) * q[2] + ow,
                                (od * o[1] + oh) * o[2] + ow,
                                lanes.min(o[2] - ow),
                            ));
                        }
                    }
                }
                runs
            }
        };
        let reach = offs.iter().copied().max().unwrap_or(0) + lanes;
        // Every load of every run stays inside the buffer: the last valid input of the last
        // channel is below cg·chan, and a partial run reads at most lanes − 1 values past it.
        if runs.iter().any(|r| r.src + reach > xq_len) {
            return Err(ConvError::Unsupported {
                algo: "direct",
                reason: "internal: a pixel run reads past the padded input".into(),
            });
        }
        Ok(Plan {
            lanes,
            chan,
            xq_len,
            taps: g.kernel_len(),
            offs: Offsets::new(offs),
            runs,
            phase_read: (0..d.stride[2])
                .map(|p| (0..d.kernel[2]).any(|r| r * d.dilation[2] % d.stride[2] == p))
                .collect(),
            input: d.input,
            pad: d.pad,
            stride: d.stride,
            q,
        })
    }

    /// Fills `xq` (length `xq_len`) with the padded polyphase copy of `xg`, the C/G input
    /// channels of one image's group (each a dense input plane).
    fn fill(&self, xg: &[f32], xq: &mut [f32]) {
        let [ind, inh, inw] = self.input;
        let plane = ind * inh * inw;
        let sub = self.q[0] * self.q[1] * self.q[2];
        let [sd, sh, sw] = self.stride;
        // The padding zeroed channel by channel just before the channel's copy (a block in L1)
        // rather than the whole buffer up front (a pass over memory that the copy then reads
        // back); then the slack after the last channel.
        xq[xg.len() / plane.max(1) * self.chan..].fill(0.0);
        for (c, xc) in xg.chunks_exact(plane).enumerate() {
            let dst = &mut xq[c * self.chan..][..self.chan];
            dst.fill(0.0);
            for id in 0..ind {
                let pd = id + self.pad[0];
                for ih in 0..inh {
                    let ph = ih + self.pad[1];
                    let row = &xc[(id * inh + ih) * inw..][..inw];
                    let phase_dh = (pd % sd) * sh + ph % sh;
                    let line = (pd / sd * self.q[1] + ph / sh) * self.q[2];
                    if sw == 1 {
                        let at = phase_dh * sub + line + self.pad[2];
                        dst[at..at + inw].copy_from_slice(row);
                    } else if sw == 2 {
                        // Deinterleaved in one pass over pairs (vectorised): with pad even,
                        // row[2t] goes to phase 0 and row[2t + 1] to phase 1, with pad odd the
                        // other way round; each phase line starts at (first + pad) / 2.
                        let pw = self.pad[2];
                        let e = pw % 2;
                        let p0 = phase_dh * 2;
                        let (lo, hi) = dst.split_at_mut((p0 + 1) * sub);
                        let ph0 = &mut lo[p0 * sub + line + (e + pw) / 2..];
                        let ph1 = &mut hi[line + (1 - e + pw) / 2..];
                        let (a, b) = if e == 0 { (ph0, ph1) } else { (ph1, ph0) };
                        let pairs = row.chunks_exact(2);
                        if let [last] = pairs.remainder() {
                            a[inw / 2] = *last;
                        }
                        for ((pair, da), db) in pairs.zip(a.iter_mut()).zip(b.iter_mut()) {
                            *da = pair[0];
                            *db = pair[1];
                        }
                    } else {
                        // Phase p of the line holds the inputs iw with (iw + pad) % sw == p,
                        // back to back from position (first + pad) / sw.
                        for p in 0..sw {
                            let first = (p + sw - self.pad[2] % sw) % sw;
                            if first >= inw || !self.phase_read[p] {
                                continue;
                            }
                            let at = (phase_dh * sw + p) * sub + line + (first + self.pad[2]) / sw;
                            for (d, &v) in dst[at..].iter_mut().zip(row[first..].iter().step_by(sw))
                            {
                                *d = v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Phase-plane lines at least this long are padded to a multiple of 8 values, so that with the
/// buffer on a 64-byte boundary every run's loads of the first tap of a line are aligned and
/// the others straddle a cache line at most half the time. Measured (probe, thread CPU time, 1
/// thread, session 7): C3D's 64@8×56² forward, flipped-direct and backward-filter 0.95-0.99×
/// (58 → 64 values per line); VGG and ResNet-50's 64@56² within noise (0.99-1.02×). Shorter
/// lines (ResNet-20, LeNet) would grow by up to 80% for no measured gain (ResNet-20's 34 → 40:
/// 1.00-1.02×).
const ALIGN_FROM: usize = 48;

/// Bytes of an image's padded copy (one group) above which the input channels may be split
/// into two blocks (half of a 1 MiB L2). ResNet-20's images (at most 41 KiB) run unsplit.
const CHUNK_ABOVE: usize = 512 << 10;

/// Largest number of steps of a half block for the split to pay: the half block's 6-channel
/// weight panel (6 × steps floats) is then at most 12 KiB and stays in L1d beside the input
/// lines of a tile.
const CHUNK_MAX_STEPS: usize = 512;

/// The input-channel blocks of a group as step ranges `(first, end)`: one block holding every
/// step, or two (whole channels, as even as possible) when the padded copy exceeds
/// [`CHUNK_ABOVE`] and half the steps are at most [`CHUNK_MAX_STEPS`]. Measured (session 6,
/// thread CPU time, 1 thread): VGG's 64@224² (2 × 288 steps) 1.06-1.12× faster split, C3D's
/// 64@8×56² (2 × 864 steps) 1.01-1.05× slower split (and 1.03-1.05× slower in six blocks of
/// 11 channels: the extra partial-sum passes over y outweigh the smaller working set),
/// ResNet-50's 64@56² (2 × 288) unchanged.
fn step_blocks(plan: &Plan, cg: usize) -> Vec<(usize, usize)> {
    let taps = plan.taps.max(1);
    let steps = cg * taps;
    let n = if plan.xq_len * size_of::<f32>() > CHUNK_ABOVE
        && cg >= 2
        && steps.div_ceil(2) <= CHUNK_MAX_STEPS
    {
        2
    } else {
        1
    };
    let (base, extra) = (cg / n, cg % n);
    let mut c0 = 0;
    (0..n)
        .map(|i| {
            let c = base + usize::from(i < extra);
            c0 += c;
            ((c0 - c) * taps, c0 * taps)
        })
        .collect()
}

/// The phase planes' line pitch of a flat plan (see [`Plan::with_layout`]), or `None` when
/// flat runs would not need fewer runs than per-line ones. Stride 1 along the lines: the
/// padding between two lines is shared (pitch = input + max(pad before, pad after), at least
/// the output line); stride s > 1: the polyphase line as it is (a valid output never reads
/// past it). At least [`LANES`] (8) values whatever the run's lanes (a run's outputs then lie
/// on at most two lines of the 8-lane tile, three of the wide tile's 16; shorter lines were
/// never measured flat).
///
/// Measured (probe, thread CPU time, 1 thread, session 8): ResNet-50's 128@28² (28 outputs
/// per 29-value line: 102 runs per plane against 112) and 256@14² (27 against 28) forward.
pub(crate) fn flat_line_pitch(g: &ConvGeometry) -> Option<usize> {
    flat_line_pitch_for(g, LANES)
}

/// [`flat_line_pitch`] for runs of `lanes` values (the wide tile's 16: ResNet-20's 8² lines
/// then run flat, 5 runs per plane against 8; its 16² and 32² lines stay per line).
pub(crate) fn flat_line_pitch_for(g: &ConvGeometry, lanes: usize) -> Option<usize> {
    let d = g.dims3();
    let (l, pa) = (MAX_RANK - 1, pad_after3(g)[MAX_RANK - 1]);
    let (wo, ho) = (d.output[l], d.output[l - 1]);
    let pitch = if d.stride[l] == 1 {
        (d.input[l] + d.pad[l].max(pa)).max(wo)
    } else {
        (d.input[l] + d.pad[l] + pa).div_ceil(d.stride[l])
    };
    if pitch < LANES || wo == 0 || ho == 0 {
        return None;
    }
    let flat = ((ho - 1) * pitch + wo).div_ceil(lanes);
    let per_line = ho * wo.div_ceil(lanes);
    (flat < per_line).then_some(pitch)
}

/// The runs of a flat plan: per output slice (all dimensions but the last two), the output
/// lines laid out `pitch` apart, cut into runs of `lanes` positions; positions at or past
/// an output line's end (`o[2]`) are dropped, so a run holds one or more pieces of outputs
/// (two at most when `pitch >= lanes`), back to back in the output plane.
fn flat_runs(
    o: [usize; MAX_RANK],
    q: [usize; MAX_RANK],
    pitch: usize,
    lanes: usize,
) -> Vec<PixelRun> {
    let (ho, wo) = (o[1], o[2]);
    let last = (ho - 1) * pitch + wo;
    let mut runs = Vec::with_capacity(o[0] * last.div_ceil(lanes));
    for od in 0..o[0] {
        for f in (0..last).step_by(lanes) {
            // The valid lanes: positions p < last whose column p % pitch is an output.
            let valid = |l: usize| f + l < last && (f + l) % pitch < wo;
            let Some(lane) = (0..lanes).find(|&l| valid(l)) else {
                continue;
            };
            let mask = (0..lanes)
                .filter(|&l| valid(l))
                .fold(0u32, |m, l| m | 1 << l);
            let p = f + lane;
            runs.push(PixelRun {
                src: od * q[1] * pitch + f,
                dst: (od * ho + p / pitch) * wo + p % pitch,
                len: mask.count_ones() as usize,
                mask,
            });
        }
    }
    runs
}

/// Padding after, right-aligned in three dimensions (1 where the geometry has no dimension).
fn pad_after3(g: &ConvGeometry) -> [usize; MAX_RANK] {
    let mut p = [0usize; MAX_RANK];
    let r = g.rank();
    p[MAX_RANK - r..].copy_from_slice(g.pad_after());
    p
}

/// The weights a direct convolution multiplies by.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Weights<'a> {
    /// The geometry's own weights, K × C/G × taps.
    Plain(&'a [f32]),
    /// For the transposed geometry of [`crate::flipped`] (the stride-1 backward-data as a
    /// forward convolution of dy): the forward layer's weights (C' × K'/G × taps of the
    /// forward geometry, whose C' and K' are this geometry's K and C), read with the channels
    /// swapped and the taps reversed, so that no flipped copy is built.
    Flipped(&'a [f32]),
}

/// The weights of group `grp` packed for the kernel: block b (`blocks[b] = (k0, m)`) is a panel
/// of `steps·mr` values holding, per step s = (input channel, tap), the weights
/// w\[k0 + i\]\[s\] for i < m, then zeros up to the tile's rows `mr` ([`MR`] or
/// [`WIDE_MR`]).
fn pack_weights(
    g: &ConvGeometry,
    grp: usize,
    w: Weights<'_>,
    blocks: &[(usize, usize)],
    mr: usize,
    wp: &mut Vec<f32>,
) {
    let (kg, cg, taps) = (
        g.out_channels_per_group(),
        g.in_channels_per_group(),
        g.kernel_len(),
    );
    let steps = cg * taps;
    wp.clear();
    wp.resize(blocks.len() * steps * mr, 0.0);
    for (b, &(k0, m)) in blocks.iter().enumerate() {
        let panel = &mut wp[b * steps * mr..][..steps * mr];
        for i in 0..m {
            let k = k0 + i;
            match w {
                Plain(w) => {
                    let row = &w[(grp * kg + k) * steps..][..steps];
                    for (s, &v) in row.iter().enumerate() {
                        panel[s * mr + i] = v;
                    }
                }
                Flipped(w) => {
                    // Forward weight [grp·cg + c][k][taps − 1 − t] (its K'/G = cg, C'/G = kg).
                    for c in 0..cg {
                        let src = &w[((grp * cg + c) * kg + k) * taps..][..taps];
                        for (t, &v) in src.iter().rev().enumerate() {
                            panel[(c * taps + t) * mr + i] = v;
                        }
                    }
                }
            }
        }
    }
}

thread_local! {
    /// This thread's polyphase buffer (reused across calls).
    static XQ: RefCell<AlignedVec> = RefCell::new(AlignedVec::new());
}

/// Frees this thread's buffers (polyphase copy, packed Wᵀ panels, the weight gradient's
/// copies; [`crate::release_workspaces`]) and returns their bytes; one in use counts 0.
pub(crate) fn release_thread() -> usize {
    use crate::{take_thread_buffer, vec_bytes};
    take_thread_buffer(&XQ, |x| 4 * x.capacity())
        + take_thread_buffer(&PANELS, vec_bytes)
        + take_thread_buffer(&FQ, |(x, dy)| 4 * x.capacity() + vec_bytes(dy))
}

/// The per-call constants shared by all threads.
struct Call<'a> {
    plan: Plan,
    /// core-blas's context (the process-wide kernel family).
    gemm: &'static Gemm,
    /// Packed weights per group.
    wp: Vec<Vec<f32>>,
    /// The output-channel blocks of a group (see [`channel_blocks`]).
    blocks: Vec<(usize, usize)>,
    bias: Option<&'a [f32]>,
    relu: bool,
    /// The input-channel blocks as step ranges (see [`step_blocks`]).
    chunks: Vec<(usize, usize)>,
    /// K/G, C/G, input plane, output plane, C.
    kg: usize,
    cg: usize,
    ilen: usize,
    olen: usize,
    c: usize,
}

impl Call<'_> {
    /// Output-channel block `kb` of group `grp` of one image on the pixel runs `runs`, from its
    /// polyphase buffer `xq`; `yb` is y of that image for the block's channels (its planes back
    /// to back).
    /// `part` = (steps of this input-channel block, first block?, last block?): the first
    /// stores (with the bias), the others add, ReLU after the last.
    fn block(
        &self,
        grp: usize,
        kb: usize,
        part: (usize, usize, bool, bool),
        runs: &[PixelRun],
        xq: &[f32],
        yb: &mut [f32],
    ) -> Result<()> {
        let (s0, s1, _, _) = part;
        let offs = &self.plan.offs;
        let gemm = self.gemm;
        if self.plan.lanes == WIDE_LANES {
            let mut acc: WideTile = Default::default();
            self.block_with(
                grp,
                kb,
                part,
                runs,
                yb,
                &mut acc,
                core_blas::wide_tile_vectors,
                |rows, wp, src, acc| {
                    gemm.offset_wide_tile(rows, wp, offs, s0..s1, xq, src, acc, false)
                },
            )
        } else {
            let mut acc: OffsetTile = Default::default();
            self.block_with(
                grp,
                kb,
                part,
                runs,
                yb,
                &mut acc,
                runs_per_tile,
                |rows, wp, src, acc| gemm.offset_tile(rows, wp, offs, s0..s1, xq, src, acc, false),
            )
        }
    }

    /// [`Call::block`] on a tile of `L` lanes × up to `NV` runs × `MRW` rows (the 8-lane
    /// [`OffsetTile`] or the [`WideTile`]): `per_tile(rows)` runs per call of `tile(rows, w
    /// panel, run bases, acc)`.
    #[allow(clippy::too_many_arguments)]
    fn block_with<const L: usize, const NV: usize, const MRW: usize>(
        &self,
        grp: usize,
        kb: usize,
        part: (usize, usize, bool, bool),
        runs: &[PixelRun],
        yb: &mut [f32],
        acc: &mut [[[f32; L]; NV]; MRW],
        per_tile: fn(usize) -> usize,
        mut tile: impl FnMut(
            usize,
            &[f32],
            &[usize],
            &mut [[[f32; L]; NV]; MRW],
        ) -> std::result::Result<(), core_blas::Error>,
    ) -> Result<()> {
        let (s0, s1, first, last) = part;
        let steps = self.plan.offs.len();
        let wp = &self.wp[grp][(kb * steps + s0) * MRW..][..(s1 - s0) * MRW];
        let (k0, rows) = self.blocks[kb];
        let k0 = grp * self.kg + k0;
        let mut src = [0usize; NV];
        for group in runs.chunks(per_tile(rows)) {
            for (s, r) in src.iter_mut().zip(group) {
                *s = r.src;
            }
            tile(rows, wp, &src[..group.len()], acc).map_err(gemm_err)?;
            let relu = self.relu && last;
            for (m, accm) in acc.iter().enumerate().take(rows) {
                // The bias joins the first partial sum; ReLU applies after the last.
                let b = if first {
                    self.bias.map_or(0.0, |b| b[k0 + m])
                } else {
                    0.0
                };
                let plane = &mut yb[m * self.olen..][..self.olen];
                for (r, vals) in group.iter().zip(accm) {
                    store_run(plane, r, vals, (first, b, relu));
                }
            }
        }
        Ok(())
    }

    /// Every group of one image: x\[n\] (`xn`, C planes) into y\[n\] (`yn`, K planes).
    fn image(&self, xn: &[f32], yn: &mut [f32], split_blocks: bool) -> Result<()> {
        // Taken out of the cell for the image (a rayon task run while this thread waits finds an
        // empty cell and allocates its own, never a borrowed one).
        let mut xq = XQ.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
        let done = (|| {
            xq.resize(self.plan.xq_len, 0.0);
            for grp in 0..self.c / self.cg {
                self.plan.fill(
                    &xn[grp * self.cg * self.ilen..][..self.cg * self.ilen],
                    &mut xq[..self.plan.xq_len],
                );
                let xq = &xq[..self.plan.xq_len];
                let yg = &mut yn[grp * self.kg * self.olen..][..self.kg * self.olen];
                // Band by band of output runs (its x lines stay in cache across the blocks),
                // every output-channel block on each band.
                // Within a band, the input channels in blocks (see [`step_blocks`]), partial
                // sums into y.
                let steps = self.plan.offs.len();
                for band in self.plan.runs.chunks(BAND) {
                    for &(s0, s1) in &self.chunks {
                        let part = (s0, s1, s0 == 0, s1 == steps);
                        let mut parts = Vec::with_capacity(self.blocks.len());
                        let mut rest = &mut *yg;
                        for &(_, m) in &self.blocks {
                            let (part, tail) = rest.split_at_mut(m * self.olen);
                            parts.push(part);
                            rest = tail;
                        }
                        if split_blocks {
                            parts
                                .into_par_iter()
                                .enumerate()
                                .try_for_each(|(kb, yb)| self.block(grp, kb, part, band, xq, yb))?;
                        } else {
                            for (kb, yb) in parts.into_iter().enumerate() {
                                self.block(grp, kb, part, band, xq, yb)?;
                            }
                        }
                    }
                }
            }
            Ok(())
        })();
        XQ.with(|cell| *cell.borrow_mut() = xq);
        done
    }
}

/// One run's sums `vals` stored into its output plane `plane`: with `first`, `y = v + b`, else
/// `y += v`; then `max(0, ·)` if `relu`. Only the run's output lanes ([`PixelRun::mask`]) are
/// stored, back to back from its `dst`.
#[inline(always)]
fn store_run<const L: usize>(
    plane: &mut [f32],
    r: &PixelRun,
    vals: &[f32; L],
    (first, b, relu): (bool, f32, bool),
) {
    let put = |o: &mut f32, v: f32| {
        let v = if first { v + b } else { *o + v };
        *o = if relu { v.max(0.0) } else { v };
    };
    if r.len == L {
        // A whole run: fixed-size, vectorised by the compiler.
        let out: &mut [f32; L] = (&mut plane[r.dst..][..L]).try_into().expect("L lanes");
        let mut v = [0.0f32; L];
        for l in 0..L {
            v[l] = if first { vals[l] + b } else { out[l] + vals[l] };
        }
        if relu {
            for l in 0..L {
                out[l] = v[l].max(0.0);
            }
        } else {
            *out = v;
        }
    } else if r.one_piece() {
        for (o, &v) in plane[r.dst..][..r.len].iter_mut().zip(vals) {
            put(o, v);
        }
    } else {
        // Pieces of lanes (a flat run drops the lanes past a line's end).
        let out = &mut plane[r.dst..][..r.len];
        let lanes = (0..L).filter(|&l| r.mask >> l & 1 == 1);
        for (o, l) in out.iter_mut().zip(lanes) {
            put(o, vals[l]);
        }
    }
}

/// y = conv(x, w) (+ bias) (then ReLU), direct (inputs validated by the caller).
pub(crate) fn forward(
    g: &ConvGeometry,
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
) -> Result<()> {
    if tiles_for(g) == Tiles::Pixels {
        return forward_pixels(g, x, w, bias, relu, y);
    }
    let gemm = Gemm::global().map_err(gemm_err)?;
    let lanes = channel_lanes(gemm);
    let mr = if lanes == WIDE_LANES { WIDE_MR } else { MR };
    let plan = Plan::forward(g, lanes)?;
    let blocks = channel_blocks(g.out_channels_per_group(), mr);
    let chunks = step_blocks(&plan, g.in_channels_per_group());
    let wp = (0..g.groups())
        .map(|grp| {
            let mut v = Vec::new();
            pack_weights(g, grp, w, &blocks, mr, &mut v);
            v
        })
        .collect();
    let call = Call {
        plan,
        gemm,
        wp,
        blocks,
        bias,
        relu,
        chunks,
        kg: g.out_channels_per_group(),
        cg: g.in_channels_per_group(),
        ilen: g.input_spatial_len(),
        olen: g.output_spatial_len(),
        c: g.in_channels(),
    };
    let (xs, ys) = (g.in_channels() * call.ilen, g.out_channels() * call.olen);
    let threads = rayon::current_num_threads();
    if threads <= 1 {
        for (xn, yn) in x.chunks_exact(xs).zip(y.chunks_exact_mut(ys)) {
            call.image(xn, yn, false)?;
        }
    } else if g.batch() >= 2 * threads {
        x.par_chunks_exact(xs)
            .zip(y.par_chunks_exact_mut(ys))
            .try_for_each(|(xn, yn)| call.image(xn, yn, false))?;
    } else {
        for (xn, yn) in x.chunks_exact(xs).zip(y.chunks_exact_mut(ys)) {
            call.image(xn, yn, true)?;
        }
    }
    Ok(())
}

/// Lanes per run of the channel tiles: core-blas's widest offset tile of the family
/// ([`core_blas::Gemm::offset_lanes`]: 16 on AVX-512, the wide tile; 8 otherwise).
pub(crate) fn channel_lanes(gemm: &Gemm) -> usize {
    gemm.offset_lanes()
}

/// `(pixels, output channels)` per pixel tile: core-blas's offset-A tile of the process-wide
/// family (6 × 16 on AVX2, 12 × 32 on AVX-512). The packed Wᵀ panels are as wide as its
/// channels.
pub(crate) fn pixel_tile() -> Result<(usize, usize)> {
    Ok(Gemm::global().map_err(gemm_err)?.offset_a_shape())
}

/// Bytes of padded input copies per block of images of the pixel-tile forward (the block's
/// copies stay in L2 beside one Wᵀ panel while every tile of the block reads them).
const PIXEL_BLOCK_BYTES: usize = 512 << 10;

/// The register tile of the direct forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tiles {
    /// [`MR`] output channels (broadcast weights) × runs of 8 output pixels (vectors of x):
    /// core-blas's [`core_blas::offset_tile`]. Loses lanes where output lines are not a
    /// multiple of 8 wide.
    Channels,
    /// [`pixel_tile`] output pixels at any bases (broadcast x values, tiles crossing lines and
    /// images) × output channels (vectors of a packed Wᵀ panel): core-blas's
    /// [`core_blas::offset_a_store`]. No lane lost on any line width.
    Pixels,
}

/// The tile the direct forward uses for `g`: pixel tiles from [`PIXEL_TILES_FROM`] output
/// channels per group on when one image's padded copy fits a block of images
/// ([`PIXEL_BLOCK_BYTES`]), channel tiles otherwise; with core-blas's 512-bit offset-A tile
/// (AVX-512: 12 pixels × 32 channels, against the channel tiles' 256-bit vectors), pixel tiles
/// whenever a group has at least a panel's 32 output channels, whatever the image size. With
/// core-blas's wide offset tile (AVX-512, [`channel_lanes`] 16: 8 channels × runs of 16
/// pixels), channel tiles up to [`WIDE_CHANNELS_UP_TO`] (32) output channels per group, pixel
/// tiles above.
///
/// Measured for the wide tile on the Intel Xeon Emerald Rapids (probe_passes, thread CPU, 1
/// thread, min of 10 rounds, batch 64, the tiles forced in alternating processes with convgemm
/// timed in each as the reference, quiet 17:44:40 UTC session 41), forward direct / convgemm
/// with wide channel tiles, 8-lane channel tiles, pixel tiles: 16@32² 0.87-0.91, 1.63, 3.2;
/// 16→32 stride 2 0.81-0.88, 1.34-1.38, 1.08-1.18; 32@16² 0.90-0.95, 1.63-1.67, 1.23-1.25; but
/// 32→64 stride 2 1.40-1.72, 1.53-1.63, 1.24-1.26 and 64@8² 1.46-1.63, 1.70-1.77, 1.17-1.46
/// (8-wide lines: 5 flat runs of 16 per plane, each 8-channel weight panel read for 5 runs).
///
/// Measured on the Intel AVX-512 Xeon (probe, thread CPU, 1 thread, min of 5, quiet
/// 17:40-17:43 UTC, session 12), pixel / channel tiles, forward: ResNet-50 64@56² 32.2 / 54.9
/// ms, VGG 64@224² 67.8 / 125.4, C3D 96.0 / 115.7, s2 128@56² 39.5 / 76.0; ResNet-20 (batch 128)
/// 32@16² 13.6-15.8 / 18.5-18.8, 64@8² 12.4-14.1 / 16.2, 16→32 s2 9.4-11.9 / 13.5-13.8,
/// 32→64 s2 9.3 / 12.4; but 16@32² (16 channels: half of each panel wasted) 24.5-30.7 /
/// 13.0-22.4.
///
/// On AVX2 (probe, thread CPU time, 1 thread, min of 4 alternations, quiet 12:00-12:09 UTC,
/// session 10; the VM at up to 50% steal, so ±5%): ResNet-50's 128@28² forward 24.3 ms with
/// pixel tiles against 27.6 with channel tiles (convgemm 24.0), its flipped backward-data 22.8
/// against 24.2 (flipped convgemm 24.0); 256@14² forward 22.7 / 23.9 (convgemm 24.0 / 25.4),
/// flipped 23.4 / 26.1 (flipped convgemm 24.2 / 27.3); 512@7² forward 25.9-27.9 against 36.0
/// with channel tiles (convgemm 24.5-26.4).
pub(crate) fn tiles_for(g: &ConvGeometry) -> Tiles {
    let kg = g.out_channels_per_group();
    if Gemm::global().is_ok_and(|gemm| channel_lanes(gemm) == WIDE_LANES) {
        return if kg <= WIDE_CHANNELS_UP_TO {
            Tiles::Channels
        } else {
            Tiles::Pixels
        };
    }
    if let Ok((_, nr)) = pixel_tile()
        && nr > 2 * LANES
    {
        return if kg >= nr {
            Tiles::Pixels
        } else {
            Tiles::Channels
        };
    }
    if kg >= PIXEL_TILES_FROM && padded_image_bytes(g) <= PIXEL_BLOCK_BYTES {
        Tiles::Pixels
    } else {
        Tiles::Channels
    }
}

/// The most output channels per group the direct forward runs on channel tiles when they are
/// core-blas's wide (16-lane) offset tiles; pixel tiles above.
pub(crate) const WIDE_CHANNELS_UP_TO: usize = 32;

/// Output channels per group from which the direct forward uses pixel tiles.
pub(crate) const PIXEL_TILES_FROM: usize = 128;

/// Bytes of one image's (one group's) padded copy in the direct convolution's plan (0 when the
/// geometry has no plan).
pub(crate) fn padded_image_bytes(g: &ConvGeometry) -> usize {
    Plan::new(g).map_or(0, |p| p.xq_len * size_of::<f32>())
}

/// The weights of group `grp` packed as Wᵀ panels of `nr` channels for the pixel tiles: panel p
/// holds, per step s = (input channel, tap), the weights w\[nr·p + o\]\[s\] for o < nr (zeros
/// past the group's last output channel), `steps · nr` values.
fn pack_panels(g: &ConvGeometry, grp: usize, w: Weights<'_>, wp: &mut [f32], nr: usize) {
    let (kg, cg, taps) = (
        g.out_channels_per_group(),
        g.in_channels_per_group(),
        g.kernel_len(),
    );
    let steps = cg * taps;
    for (p, panel) in wp.chunks_exact_mut(steps * nr).enumerate() {
        let rows = nr.min(kg - p * nr);
        if rows < nr {
            panel.fill(0.0);
        }
        match w {
            Plain(w) => {
                // The panel's rows of w side by side: nr read streams, the panel written in
                // order.
                let block = &w[(grp * kg + p * nr) * steps..][..rows * steps];
                for (s, col) in panel.chunks_exact_mut(nr).enumerate() {
                    for (o, d) in col[..rows].iter_mut().enumerate() {
                        *d = block[o * steps + s];
                    }
                }
            }
            Flipped(w) => {
                // Forward weight [grp·cg + c][k][taps − 1 − t] (its K'/G = cg, C'/G = kg): per
                // input channel c the panel's nr output channels are nr runs of taps in w.
                for (c, cols) in panel.chunks_exact_mut(taps * nr).enumerate() {
                    let block = &w[((grp * cg + c) * kg + p * nr) * taps..][..rows * taps];
                    for (t, col) in cols.chunks_exact_mut(nr).enumerate() {
                        for (o, d) in col[..rows].iter_mut().enumerate() {
                            *d = block[o * taps + taps - 1 - t];
                        }
                    }
                }
            }
        }
    }
}

thread_local! {
    /// The calling thread's packed Wᵀ panels of the pixel-tile forward (reused across calls).
    static PANELS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The per-call constants of the pixel-tile forward shared by all threads.
struct PixelCall<'a> {
    plan: Plan,
    gemm: &'static Gemm,
    /// Pixels and output channels per tile ([`pixel_tile`]).
    pixels: usize,
    panel: usize,
    /// Wᵀ panels, `group_len` floats per group (see [`pack_panels`]).
    wp: &'a [f32],
    group_len: usize,
    /// Offset of every output pixel's first input (tap 0, channel 0) in an image's copy.
    bases: Vec<usize>,
    /// The pixel tiles of one image when they follow its output lines ([`line_tiles`]); empty
    /// when tiles of [`PixelCall::pixels`] run across lines and images.
    line_tiles: Vec<Range<usize>>,
    bias: Option<&'a [f32]>,
    relu: bool,
    /// K/G, C/G, input plane, output plane, C, K.
    kg: usize,
    cg: usize,
    ilen: usize,
    olen: usize,
    c: usize,
    k: usize,
}

impl PixelCall<'_> {
    /// Images `xb` (whole images, C planes each) into `yb` (K planes each), every group, every
    /// panel; with `split_panels` the panels of a group run in parallel (one image only).
    fn images(&self, xb: &[f32], yb: &mut [f32], split_panels: bool) -> Result<()> {
        let (xs, ys) = (self.c * self.ilen, self.k * self.olen);
        let nb = xb.len() / xs;
        let xq_len = self.plan.xq_len;
        let mut xq = XQ.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
        let done = (|| {
            xq.resize(nb * xq_len, 0.0);
            // Every pixel of the block: its base in the copies, its place in yb's first plane.
            let (mut bases, mut dsts) = (Vec::with_capacity(nb * self.olen), Vec::new());
            dsts.reserve(nb * self.olen);
            for j in 0..nb {
                bases.extend(self.bases.iter().map(|&b| j * xq_len + b));
                dsts.extend((0..self.olen).map(|p| j * ys + p));
            }
            let tiles: Vec<Range<usize>> = if self.line_tiles.is_empty() {
                let all = nb * self.olen;
                (0..all)
                    .step_by(self.pixels)
                    .map(|p| p..all.min(p + self.pixels))
                    .collect()
            } else {
                (0..nb)
                    .flat_map(|j| {
                        let at = j * self.olen;
                        self.line_tiles
                            .iter()
                            .map(move |t| at + t.start..at + t.end)
                    })
                    .collect()
            };
            let steps = self.plan.offs.len();
            for grp in 0..self.c / self.cg {
                for (j, xn) in xb.chunks_exact(xs).enumerate() {
                    self.plan.fill(
                        &xn[grp * self.cg * self.ilen..][..self.cg * self.ilen],
                        &mut xq[j * xq_len..][..xq_len],
                    );
                }
                let xq = &xq[..nb * xq_len];
                let nr = self.panel;
                let panel = |p: usize, y: &mut [f32]| -> Result<()> {
                    let k0 = p * nr;
                    let channels = nr.min(self.kg - k0);
                    let wt = &self.wp[grp * self.group_len + p * steps * nr..][..steps * nr];
                    let bias = self.bias.map(|b| &b[grp * self.kg + k0..]);
                    for t in &tiles {
                        self.gemm
                            .offset_a_store(
                                wt,
                                &self.plan.offs,
                                0..steps,
                                xq,
                                &bases[t.clone()],
                                y,
                                &dsts[t.clone()],
                                self.olen,
                                channels,
                                OffsetAStore::Set { bias },
                                self.relu,
                            )
                            .map_err(gemm_err)?;
                    }
                    Ok(())
                };
                let panels = self.kg.div_ceil(nr);
                let y0 = grp * self.kg * self.olen;
                if split_panels {
                    // One image: the panels' channel planes are disjoint pieces of yb.
                    let yg = &mut yb[y0..][..self.kg * self.olen];
                    yg.par_chunks_mut(nr * self.olen)
                        .enumerate()
                        .try_for_each(|(p, y)| panel(p, y))?;
                } else {
                    for p in 0..panels {
                        panel(p, &mut yb[y0 + p * nr * self.olen..])?;
                    }
                }
            }
            Ok(())
        })();
        XQ.with(|cell| *cell.borrow_mut() = xq);
        done
    }
}

/// [`forward`] with pixel tiles ([`Tiles::Pixels`]).
fn forward_pixels(
    g: &ConvGeometry,
    x: &[f32],
    w: Weights<'_>,
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
) -> Result<()> {
    let plan = Plan::new(g)?;
    let d = g.dims3();
    let (o, q) = (d.output, plan.q);
    let mut bases = Vec::with_capacity(g.output_spatial_len());
    for od in 0..o[0] {
        for oh in 0..o[1] {
            bases.extend((0..o[2]).map(|ow| (od * q[1] + oh) * q[2] + ow));
        }
    }
    let (mr, nr) = pixel_tile()?;
    let group_len =
        g.out_channels_per_group().div_ceil(nr) * nr * g.in_channels_per_group() * g.kernel_len();
    let mut wp = PANELS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    // Every value is written by the packing below (zeros past a group's last channel).
    wp.resize(g.groups() * group_len, 0.0);
    for (grp, wg) in wp.chunks_exact_mut(group_len.max(1)).enumerate() {
        pack_panels(g, grp, w, wg, nr);
    }
    let done = forward_pixels_with(g, x, bias, relu, y, plan, bases, &wp, group_len, (mr, nr));
    PANELS.with(|cell| *cell.borrow_mut() = wp);
    done
}

/// The pixel tiles of one image (ranges of its output pixels in order) when tiles of `mr`
/// pixels should not cross output lines: core-blas runs its widest offset-A tiles (AVX-512's 12
/// pixels) only on runs of consecutive bases ([`core_blas::Gemm::offset_a_shape`]), and an
/// output line is such a run in the padded copy. Each line split evenly into tiles of at most
/// `mr` pixels (224 → 19 tiles of 11-12, 28 → 9 + 9 + 10, 14 → 7 + 7, 7 → 7). Empty (tiles
/// run across lines) for tiles of at most 6 pixels, which core-blas runs at any bases.
fn line_tiles(g: &ConvGeometry, mr: usize) -> Vec<Range<usize>> {
    if mr <= 6 {
        return Vec::new();
    }
    let w = g.output().last().copied().unwrap_or(1).max(1);
    let per_line = w.div_ceil(mr);
    (0..g.output_spatial_len())
        .step_by(w)
        .flat_map(|l| (0..per_line).map(move |t| l + t * w / per_line..l + (t + 1) * w / per_line))
        .collect()
}

/// [`forward_pixels`] once the panels are packed (`wp`: `group_len` floats per group).
#[allow(clippy::too_many_arguments)]
fn forward_pixels_with(
    g: &ConvGeometry,
    x: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
    plan: Plan,
    bases: Vec<usize>,
    wp: &[f32],
    group_len: usize,
    (pixels, panel): (usize, usize),
) -> Result<()> {
    let call = PixelCall {
        gemm: Gemm::global().map_err(gemm_err)?,
        line_tiles: line_tiles(g, pixels),
        pixels,
        panel,
        wp,
        group_len,
        bases,
        bias,
        relu,
        kg: g.out_channels_per_group(),
        cg: g.in_channels_per_group(),
        ilen: g.input_spatial_len(),
        olen: g.output_spatial_len(),
        c: g.in_channels(),
        k: g.out_channels(),
        plan,
    };
    let (xs, ys) = (call.c * call.ilen, call.k * call.olen);
    let n = g.batch();
    let threads = rayon::current_num_threads();
    // Images per block: the block's copies within PIXEL_BLOCK_BYTES, and at least one block
    // per thread.
    let fit = (PIXEL_BLOCK_BYTES / (call.plan.xq_len * size_of::<f32>()).max(1)).max(1);
    let nb = fit.min(n.div_ceil(threads)).max(1);
    if threads > 1 && n < threads {
        for (xn, yn) in x.chunks_exact(xs).zip(y.chunks_exact_mut(ys)) {
            call.images(xn, yn, true)?;
        }
    } else if threads > 1 {
        x.par_chunks(nb * xs)
            .zip(y.par_chunks_mut(nb * ys))
            .try_for_each(|(xb, yb)| call.images(xb, yb, false))?;
    } else {
        for (xb, yb) in x.chunks(nb * xs).zip(y.chunks_mut(nb * ys)) {
            call.images(xb, yb, false)?;
        }
    }
    Ok(())
}

/// Bytes of padded input copies per block of images in [`backward_filter`] (the block's copies
/// stay in L2 while every (output-channel, column) tile reads them).
const FILTER_BLOCK_BYTES: usize = 256 << 10;

/// Pixel runs per [`core_blas::offset_dot_rows`] call in [`backward_filter`]: the 3 dy rows of
/// a call (3 × 128 × 8 floats = 12 KiB) stay in L1d across the column tiles.
const FILTER_RUNS: usize = 128;

thread_local! {
    /// This thread's padded copies of a block of images and its dy rows (reused across calls).
    static FQ: RefCell<(AlignedVec, Vec<f32>)> = RefCell::new((AlignedVec::new(), Vec::new()));
}

/// dw = Σ over images and output pixels of dy ⊗ x (the weight gradient), direct (inputs
/// validated by the caller; dw overwritten).
///
/// dw\[k\]\[c, t\] = Σ_n Σ_p dy\[n\]\[k\]\[p\] · xq_n\[c\]\[base(p) + off(t)\]: the forward's
/// polyphase copies and offsets, with the pixels as the reduction. Per block of images (their
/// copies side by side, about [`FILTER_BLOCK_BYTES`]) and group, dy is copied run by run
/// (zero-padded partial runs: their lanes add 0 · x, and when x holds a NaN or infinity the
/// partial runs are summed apart over their own lanes, so that it reaches exactly the dw
/// entries whose sums contain it), then core-blas's [`core_blas::offset_dot_rows`]
/// (3 output channels × every column, in tiles of 4 columns, dot products over up to
/// [`FILTER_RUNS`] runs per call, added into dw). Threads: the images split in contiguous parts, one dw partial sum per part,
/// when there are at least as many blocks of images as threads; else each block's dw rows
/// split across the threads.
pub(crate) fn backward_filter(
    g: &ConvGeometry,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
) -> Result<()> {
    let plan = Plan::new(g)?;
    let gemm = Gemm::global().map_err(gemm_err)?;
    let batch = g.batch();
    let per_image = plan.xq_len;
    let block = (FILTER_BLOCK_BYTES / (per_image * size_of::<f32>())).clamp(1, batch.max(1));
    let threads = rayon::current_num_threads();
    let blocks = batch.div_ceil(block);
    if threads <= 1 || blocks < threads {
        // One part; with several threads, each block's dw rows split across them.
        return filter_images(g, &plan, gemm, block, 0..batch, x, dy, dw, threads > 1);
    }
    let parts = threads;
    // Contiguous image ranges, as even as possible; part 0 writes dw, the others partials.
    let ranges: Vec<Range<usize>> = (0..parts)
        .map(|i| (batch * i / parts)..(batch * (i + 1) / parts))
        .collect();
    let (first, rest) = ranges.split_first().expect("parts >= 2");
    let (r0, partials) = rayon::join(
        || filter_images(g, &plan, gemm, block, first.clone(), x, dy, dw, false),
        || {
            rest.par_iter()
                .map(|r| {
                    let mut part = vec![0f32; g.w_len()];
                    filter_images(g, &plan, gemm, block, r.clone(), x, dy, &mut part, false)?;
                    Ok(part)
                })
                .collect::<Result<Vec<Vec<f32>>>>()
        },
    );
    r0?;
    for part in partials? {
        for (d, p) in dw.iter_mut().zip(&part) {
            *d += p;
        }
    }
    Ok(())
}

/// Whether every value of `v` is finite (no NaN, no ±inf): x · 0 is ±0 for a finite x and NaN
/// otherwise, summed in 16 independent lanes (vectorised on baseline SSE2).
fn all_finite(v: &[f32]) -> bool {
    let mut acc = [0f32; 16];
    let chunks = v.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x * 0.0;
        }
    }
    for (a, &x) in acc.iter_mut().zip(tail) {
        *a += x * 0.0;
    }
    acc.iter().all(|&a| a == 0.0)
}

/// Whether [`backward_filter`] reads dy in place: its planes are the runs back to back (whole
/// runs, output lines a multiple of 8) and an image has enough runs for whole calls
/// (ResNet-20's 32² layers); else dy is copied run by run.
fn dy_in_place(plan: &Plan) -> bool {
    plan.runs.len() >= FILTER_RUNS
        && plan
            .runs
            .iter()
            .enumerate()
            .all(|(i, r)| r.len == LANES && r.dst == i * LANES)
}

/// dw := the weight gradient of the images `images`, in blocks of `block` images; with
/// `split_rows`, each block's dw rows are split across the pool's threads.
#[allow(clippy::too_many_arguments)]
fn filter_images(
    g: &ConvGeometry,
    plan: &Plan,
    gemm: &Gemm,
    block: usize,
    images: Range<usize>,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    split_rows: bool,
) -> Result<()> {
    dw.fill(0.0);
    let (kg, cg) = (g.out_channels_per_group(), g.in_channels_per_group());
    let (ilen, olen) = (g.input_spatial_len(), g.output_spatial_len());
    let (c, k) = (g.in_channels(), g.out_channels());
    let wcols = plan.offs.len();
    let nr = plan.runs.len();
    let per_image = plan.xq_len;
    let in_place = dy_in_place(plan);
    let has_partial = plan.runs.iter().any(|r| r.len < LANES);
    let (mut xq, mut dq) = FQ.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    let done = (|| {
        let mut n0 = images.start;
        while n0 < images.end {
            let b = block.min(images.end - n0);
            // The block's runs in calls of at most FILTER_RUNS: (where the call's first run
            // starts in its dy rows, the runs' bases into the side-by-side copies). With
            // `in_place`, dy is read where it is (each call within one image, rows `olen`
            // apart); else from `dq`, the block's runs copied row by row.
            let chunks: Vec<(usize, Offsets)> = if in_place {
                (0..b)
                    .flat_map(|i| {
                        plan.runs
                            .chunks(FILTER_RUNS)
                            .enumerate()
                            .map(move |(q, ch)| {
                                let at = (n0 + i) * k * olen + q * FILTER_RUNS * LANES;
                                let bases = ch.iter().map(|r| i * per_image + r.src).collect();
                                (at, Offsets::new(bases))
                            })
                    })
                    .collect()
            } else {
                let bases: Vec<usize> = (0..b)
                    .flat_map(|i| plan.runs.iter().map(move |r| i * per_image + r.src))
                    .collect();
                bases
                    .chunks(FILTER_RUNS)
                    .enumerate()
                    .map(|(q, ch)| (q * FILTER_RUNS * LANES, Offsets::new(ch.to_vec())))
                    .collect()
            };
            let ldd = if in_place { olen } else { b * nr * LANES };
            xq.resize(b * per_image, 0.0);
            if !in_place {
                dq.resize(kg * ldd, 0.0);
            }
            for grp in 0..g.groups() {
                for i in 0..b {
                    let n = n0 + i;
                    plan.fill(
                        &x[(n * c + grp * cg) * ilen..][..cg * ilen],
                        &mut xq[i * per_image..][..per_image],
                    );
                    for kk in (0..kg).filter(|_| !in_place) {
                        let plane = &dy[(n * k + grp * kg + kk) * olen..][..olen];
                        let row = &mut dq[kk * ldd + i * nr * LANES..][..nr * LANES];
                        for (r, dst) in plan.runs.iter().zip(row.chunks_exact_mut(LANES)) {
                            if r.len == LANES {
                                // A whole run: a fixed-size copy (two vector moves, no call).
                                let d: &mut [f32; LANES] = dst.try_into().expect("LANES");
                                *d = plane[r.dst..][..LANES].try_into().expect("LANES");
                            } else {
                                dst[..r.len].copy_from_slice(&plane[r.dst..][..r.len]);
                                dst[r.len..].fill(0.0);
                            }
                        }
                    }
                }
                // A partial run's lanes past its end multiply a zero dy value by whatever x
                // holds there (the next line's or channel's values): 0 · inf = NaN where the
                // sum has no such term. When x is not all finite (checked on the block's
                // copies, only where there are partial runs), the partial runs are taken out
                // of the kernel's calls (their bases moved onto a zero tail) and summed over
                // their own lanes below.
                let dirty = has_partial && !all_finite(&xq[..b * per_image]);
                let dirty_chunks: Vec<(usize, Offsets)>;
                let chunks = if dirty {
                    let zero = b * per_image;
                    xq.resize(zero + plan.offs.max() + LANES, 0.0);
                    xq[zero..].fill(0.0);
                    let bases: Vec<usize> = (0..b)
                        .flat_map(|i| {
                            plan.runs.iter().map(move |r| {
                                if r.len == LANES {
                                    i * per_image + r.src
                                } else {
                                    zero
                                }
                            })
                        })
                        .collect();
                    dirty_chunks = bases
                        .chunks(FILTER_RUNS)
                        .enumerate()
                        .map(|(q, ch)| (q * FILTER_RUNS * LANES, Offsets::new(ch.to_vec())))
                        .collect();
                    &dirty_chunks
                } else {
                    &chunks
                };
                let dwg = &mut dw[grp * kg * wcols..][..kg * wcols];
                let xb = &xq[..];
                // The dy rows of this group: `src[at + kk·ldd ..]` is row kk of a call.
                let src: &[f32] = if in_place {
                    &dy[grp * kg * olen..]
                } else {
                    &dq[..]
                };
                // dw rows k0.. (`out`: whole rows) over every run of the block.
                let rows_block = |k_first: usize, out: &mut [f32]| -> Result<()> {
                    let kn = out.len() / wcols;
                    for (at, runs) in chunks {
                        for kk in (0..kn).step_by(DOT_MR) {
                            let m = DOT_MR.min(kn - kk);
                            let rows = &src[(k_first + kk) * ldd + at..];
                            gemm.offset_dot_rows(
                                m,
                                rows,
                                ldd,
                                runs,
                                &plan.offs,
                                xb,
                                &mut out[kk * wcols..],
                                wcols,
                            )
                            .map_err(gemm_err)?;
                        }
                    }
                    Ok(())
                };
                if split_rows && kg > DOT_MR {
                    // Contiguous row ranges (multiples of DOT_MR), one rayon task each.
                    let threads = rayon::current_num_threads().max(1);
                    let per = kg.div_ceil(DOT_MR).div_ceil(threads) * DOT_MR;
                    dwg.par_chunks_mut(per * wcols)
                        .enumerate()
                        .try_for_each(|(i, out)| rows_block(i * per, out))?;
                } else {
                    rows_block(0, dwg)?;
                }
                if dirty {
                    // The partial runs over their own lanes only.
                    for i in 0..b {
                        for (q, r) in plan.runs.iter().enumerate() {
                            if r.len == LANES {
                                continue;
                            }
                            for kk in 0..kg {
                                let d = &dq[kk * ldd + (i * nr + q) * LANES..][..r.len];
                                let out = &mut dwg[kk * wcols..][..wcols];
                                for (o, &off) in out.iter_mut().zip(plan.offs.as_slice()) {
                                    let xs = &xb[i * per_image + r.src + off..][..r.len];
                                    *o += d.iter().zip(xs).map(|(a, b)| a * b).sum::<f32>();
                                }
                            }
                        }
                    }
                }
            }
            n0 += b;
        }
        Ok(())
    })();
    FQ.with(|cell| *cell.borrow_mut() = (xq, dq));
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pixel-tile forward (forced, whatever [`tiles_for`] would pick) against the naive
    /// reference: strided, dilated, grouped, 1-D and 3-D layers, output channels per group not a
    /// multiple of 16 (partial panels) and pixel counts not a multiple of 6 (partial tiles,
    /// tiles crossing lines and images), bias and ReLU, NaN-filled outputs, the flipped weights
    /// of the backward-data pass, under the three schedules (one thread; blocks of images split
    /// across threads; one image with its panels split across threads).
    #[test]
    fn pixel_tiles_against_the_reference() {
        use crate::testing::{Tolerance, uniform};
        let layers = [
            ConvGeometry::new(5, 7, 21, &[11, 9], &[3, 3])
                .unwrap()
                .with_padding_per_side(&[1, 2], &[0, 1])
                .unwrap(),
            ConvGeometry::new(3, 16, 32, &[17, 16], &[3, 3])
                .unwrap()
                .with_stride(&[2])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(2, 6, 18, &[5, 9, 10], &[3, 2, 3])
                .unwrap()
                .with_stride(&[1, 2, 3])
                .unwrap()
                .with_dilation(&[1, 2, 1])
                .unwrap()
                .with_padding(&[1])
                .unwrap()
                .with_groups(3)
                .unwrap(),
            ConvGeometry::new(4, 5, 17, &[29], &[5])
                .unwrap()
                .with_stride(&[3])
                .unwrap()
                .with_dilation(&[2])
                .unwrap()
                .with_padding(&[4])
                .unwrap(),
            ConvGeometry::new(9, 24, 40, &[7, 7], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(1, 8, 3, &[4, 5], &[2, 2]).unwrap(),
        ];
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (i, g) in layers.iter().enumerate() {
                let x = uniform(70 + i as u64, g.x_len());
                let w = uniform(80 + i as u64, g.w_len());
                let bias = uniform(90 + i as u64, g.out_channels());
                let tol = Tolerance::for_f32_sum(g.in_channels_per_group() * g.kernel_len());
                let mut want = vec![0f32; g.y_len()];
                crate::reference::forward(g, &x, &w, Some(&bias), &mut want).unwrap();
                for relu in [false, true] {
                    let mut y = vec![f32::NAN; g.y_len()];
                    pool.install(|| forward_pixels(g, &x, Plain(&w), Some(&bias), relu, &mut y))
                        .unwrap();
                    let want: Vec<f32> = if relu {
                        want.iter().map(|v| v.max(0.0)).collect()
                    } else {
                        want.clone()
                    };
                    tol.check(&format!("{threads} threads, relu {relu}, {g:?}"), &y, &want)
                        .unwrap();
                }
                // The flipped weights: the stride-1 backward-data as a forward convolution.
                if let Ok(gt) = crate::flipped::transposed_geometry(g) {
                    let dy = uniform(100 + i as u64, g.y_len());
                    let mut want = vec![0f32; g.x_len()];
                    crate::reference::backward_data(g, &dy, &w, &mut want).unwrap();
                    let mut dx = vec![f32::NAN; g.x_len()];
                    pool.install(|| forward_pixels(&gt, &dy, Flipped(&w), None, false, &mut dx))
                        .unwrap();
                    Tolerance::for_f32_sum(g.out_channels_per_group() * g.kernel_len())
                        .check(&format!("dx, {threads} threads, {g:?}"), &dx, &want)
                        .unwrap();
                }
            }
        }
    }

    /// The geometries of the `direct_with_input_channel_blocks` integration test do take the
    /// two-block path, and small images (ResNet-20's) and long 3-D kernels do not.
    #[test]
    fn input_channel_blocks() {
        let big = ConvGeometry::new(2, 17, 13, &[103, 117], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        assert_eq!(
            step_blocks(&Plan::new(&big).unwrap(), 17),
            vec![(0, 81), (81, 153)]
        );
        let big3 = ConvGeometry::new(1, 9, 7, &[11, 60, 61], &[3, 1, 3])
            .unwrap()
            .with_padding_per_side(&[1, 0, 2], &[0, 0, 1])
            .unwrap();
        assert_eq!(step_blocks(&Plan::new(&big3).unwrap(), 9).len(), 2);
        let rn20 = ConvGeometry::new(128, 64, 64, &[8, 8], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        assert_eq!(step_blocks(&Plan::new(&rn20).unwrap(), 64), vec![(0, 576)]);
        let c3d = ConvGeometry::new(1, 64, 64, &[8, 56, 56], &[3, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        assert_eq!(step_blocks(&Plan::new(&c3d).unwrap(), 64).len(), 1);
    }

    /// The geometries of the `direct_flat_runs` integration test do get flat plans, with the
    /// run shapes it means to cover; the 56², 224² and 7² lines (whole runs, or no
    /// fewer runs flat) and 1-D layers do not.
    #[test]
    fn flat_plans() {
        let lenet = ConvGeometry::new(3, 6, 16, &[14, 14], &[5, 5]).unwrap();
        assert_eq!(flat_line_pitch(&lenet), Some(14));
        let r50 = |c, hw| {
            ConvGeometry::new(2, c, c, &[hw, hw], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap()
        };
        assert_eq!(flat_line_pitch(&r50(12, 28)), Some(29));
        let s2 = ConvGeometry::new(2, 5, 7, &[13, 23], &[3, 3])
            .unwrap()
            .with_stride(&[1, 2])
            .unwrap()
            .with_padding_per_side(&[1, 2], &[2, 1])
            .unwrap();
        assert_eq!(flat_line_pitch(&s2), Some(13));
        let dil = ConvGeometry::new(1, 4, 9, &[12, 21], &[3, 3])
            .unwrap()
            .with_dilation(&[2])
            .unwrap()
            .with_padding_per_side(&[2, 1], &[0, 2])
            .unwrap();
        assert_eq!(flat_line_pitch(&dil), Some(23));
        let one = ConvGeometry::new(2, 6, 10, &[9, 10], &[1, 1])
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        assert_eq!(flat_line_pitch(&one), Some(12));
        let c3 = ConvGeometry::new(2, 6, 8, &[3, 6, 12], &[3, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(2)
            .unwrap();
        assert_eq!(flat_line_pitch(&c3), Some(13));
        // Run shapes: a run starting past a line's end, one holding two pieces, whole runs.
        let runs = Plan::forward(&r50(12, 28), LANES).unwrap().runs;
        assert_eq!(runs.len(), 102);
        assert!(runs.iter().any(|r| r.mask & 1 == 0));
        assert!(runs.iter().any(|r| !r.one_piece() && r.mask & 1 == 1));
        assert!(runs.iter().any(|r| r.len == LANES));
        assert_eq!(runs.iter().map(|r| r.len).sum::<usize>(), 28 * 28);
        assert!(runs.iter().all(|r| r.mask.count_ones() as usize == r.len));
        // The wide tile's 16 lanes: ResNet-20's 8² lines run flat (pitch 9: 5 runs per plane,
        // some holding pieces of three lines), its 16² and 32² lines per line.
        let rn20 = |c, hw| r50(c, hw);
        assert_eq!(flat_line_pitch_for(&rn20(64, 8), WIDE_LANES), Some(9));
        let runs = Plan::forward(&rn20(64, 8), WIDE_LANES).unwrap().runs;
        assert_eq!(runs.len(), 5);
        assert_eq!(runs.iter().map(|r| r.len).sum::<usize>(), 64);
        // Pieces of a run: its lanes that start a piece (set, with the lane below clear).
        let pieces = |r: &PixelRun| (r.mask & !(r.mask << 1)).count_ones();
        assert_eq!(runs.iter().map(pieces).max(), Some(3));
        for hw in [16, 32] {
            assert_eq!(flat_line_pitch_for(&rn20(16, hw), WIDE_LANES), None);
        }
        // The per-line plans of the backward-filter pass stay per line.
        assert_eq!(Plan::new(&r50(12, 28)).unwrap().runs.len(), 112);
        for g in [r50(64, 56), r50(64, 224), r50(512, 7)] {
            assert_eq!(flat_line_pitch(&g), None, "{g:?}");
        }
        let one_d = ConvGeometry::new(1, 2, 2, &[30], &[3]).unwrap();
        assert_eq!(flat_line_pitch(&one_d), None);
    }

    /// The direct backward-filter reads dy in place on the geometry the integration test
    /// `direct_backward_filter_blocks_and_threads` uses for it, and copies it otherwise.
    #[test]
    fn backward_filter_dy_in_place() {
        let g = |input: &[usize]| {
            ConvGeometry::new(5, 6, 4, input, &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap()
                .with_groups(2)
                .unwrap()
        };
        assert!(dy_in_place(&Plan::new(&g(&[32, 40])).unwrap()));
        assert!(!dy_in_place(&Plan::new(&g(&[32, 36])).unwrap()));
        assert!(!dy_in_place(&Plan::new(&g(&[8, 8])).unwrap()));
    }
}
