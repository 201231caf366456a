//! What the conv-ops packers share (the micro-panel walk, small copies) and what the convgemm
//! packers ([`Im2colB`](crate::Im2colB) and
//! [`Im2colTB`](crate::Im2colTB)) share: reading im2col(x) of one group straight from x.
//!
//! An im2col entry is addressed by (channel, kernel tap) on one side and (image, output position)
//! on the other. Output positions are cut into *runs* that share (image, outer output
//! coordinates): along a run the input index advances by the innermost stride. For one tap and
//! one run the readable part is a *segment* — the positions that do not fall in the padding —
//! whose offset in x depends on the tap and the run but not on the channel, so a table of
//! segments per (tap, run) serves every channel of a block.

use crate::geometry::{ConvGeometry, Dims3};
use crate::im2col::split3;

/// im2col(x) of one group, read in place.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Source<'a> {
    pub(crate) x: &'a [f32],
    pub(crate) d: Dims3,
    /// Offset of the group's first channel plane inside one image.
    group_off: usize,
    /// Elements of one input image (C·I).
    image: usize,
    /// Elements of one channel plane.
    ilen: usize,
    /// Kernel taps R.
    pub(crate) rlen: usize,
    /// Output positions O.
    olen: usize,
}

/// Output positions `start..start+len` (relative to the first position asked for) that share
/// (image `n`, `o0`, `o1`); `o2` is the innermost output coordinate of the first.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Run {
    pub(crate) start: usize,
    pub(crate) len: usize,
    n: usize,
    o0: usize,
    o1: usize,
    o2: usize,
}

/// Positions `lo..hi` of a run read the input from `plane + at` onwards (with the innermost
/// stride); positions before `lo` and from `hi` on fall in the padding.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub(crate) lo: usize,
    pub(crate) hi: usize,
    pub(crate) at: usize,
}

impl<'a> Source<'a> {
    /// Group `grp` of x (validated by the caller: `x.len() == g.x_len()`, `grp < groups`).
    pub(crate) fn new(g: &ConvGeometry, grp: usize, x: &'a [f32]) -> Self {
        debug_assert_eq!(x.len(), g.x_len());
        debug_assert!(grp < g.groups());
        let ilen = g.input_spatial_len();
        Source {
            x,
            d: g.dims3(),
            group_off: grp * g.in_channels_per_group() * ilen,
            image: g.in_channels() * ilen,
            ilen,
            rlen: g.kernel_len(),
            olen: g.output_spatial_len(),
        }
    }

    /// Offset of channel `c` (within the group) of image 0.
    #[inline(always)]
    pub(crate) fn plane(&self, c: usize) -> usize {
        self.group_off + c * self.ilen
    }

    /// Elements of one input image (C·I).
    #[inline(always)]
    pub(crate) fn image_len(&self) -> usize {
        self.image
    }

    /// Output positions O of one image.
    #[inline(always)]
    pub(crate) fn olen(&self) -> usize {
        self.olen
    }

    /// Whether consecutive output lines of one image (and outer coordinate) read one straight
    /// stretch of every channel plane for every tap: stride 1 along the line and the input
    /// advancing by exactly one output line's length from one output line to the next.
    pub(crate) fn lines_are_straight(&self) -> bool {
        let d = &self.d;
        d.stride[2] == 1 && d.stride[1] * d.input[2] == d.output[2]
    }

    /// Whether run `b` is the output line right after run `a` in the same image and outer
    /// coordinate, `a` ending its line and `b` starting the next.
    pub(crate) fn next_line(&self, a: &Run, b: &Run) -> bool {
        a.n == b.n
            && a.o0 == b.o0
            && a.o1 + 1 == b.o1
            && b.o2 == 0
            && a.o2 + a.len == self.d.output[2]
            && a.start + a.len == b.start
    }

    /// Cuts (image, output position) indices `first..first+count` into runs.
    pub(crate) fn runs(&self, first: usize, count: usize, out: &mut Vec<Run>) {
        out.clear();
        self.push_runs(first, count, out);
    }

    /// [`Source::runs`] appended to `out`; returns how many were appended.
    pub(crate) fn push_runs(&self, first: usize, count: usize, out: &mut Vec<Run>) -> usize {
        let before = out.len();
        let o = &self.d.output;
        let (mut n, pos) = (first / self.olen, first % self.olen);
        let (mut o0, mut o1, mut o2) = (pos / (o[1] * o[2]), (pos / o[2]) % o[1], pos % o[2]);
        let mut t = 0;
        while t < count {
            let len = (count - t).min(o[2] - o2);
            out.push(Run {
                start: t,
                len,
                n,
                o0,
                o1,
                o2,
            });
            t += len;
            o2 = 0;
            o1 += 1;
            if o1 == o[1] {
                o1 = 0;
                o0 += 1;
                if o0 == o[0] {
                    o0 = 0;
                    n += 1;
                }
            }
        }
        out.len() - before
    }

    /// The segment of every (tap, run), tap-major: `segs[tap · runs.len() + i]`.
    pub(crate) fn segments(&self, runs: &[Run], segs: &mut Vec<Seg>) {
        segs.clear();
        self.push_segments(runs, segs);
    }

    /// [`Source::segments`] appended to `segs`.
    pub(crate) fn push_segments(&self, runs: &[Run], segs: &mut Vec<Seg>) {
        let d = &self.d;
        let (s, wid) = (d.stride[2] as isize, d.input[2] as isize);
        for tap in 0..self.rlen {
            let rk = split3(tap, &d.kernel);
            let off = |i: usize| (rk[i] * d.dilation[i]) as isize - d.pad[i] as isize;
            let (off0, off1, off2) = (off(0), off(1), off(2));
            for run in runs {
                let i0 = (run.o0 * d.stride[0]) as isize + off0;
                let i1 = (run.o1 * d.stride[1]) as isize + off1;
                if i0 < 0 || i0 >= d.input[0] as isize || i1 < 0 || i1 >= d.input[1] as isize {
                    segs.push(Seg {
                        lo: 0,
                        hi: 0,
                        at: 0,
                    });
                    continue;
                }
                let first = (run.o2 * d.stride[2]) as isize + off2;
                // Positions t of the run with 0 <= first + t·s < wid.
                let lo = if first >= 0 { 0 } else { (-first + s - 1) / s };
                let hi = if first >= wid {
                    0
                } else {
                    (wid - first + s - 1) / s
                };
                let lo = lo.min(run.len as isize);
                let hi = hi.clamp(lo, run.len as isize);
                let line =
                    run.n * self.image + (i0 as usize * d.input[1] + i1 as usize) * d.input[2];
                segs.push(Seg {
                    lo: lo as usize,
                    hi: hi as usize,
                    at: line + (first + lo * s).max(0) as usize,
                });
            }
        }
    }

    /// Hints the cache lines of x that the runs `runs` read, for the channels (of the group)
    /// `channels`, toward L2: per run, channel and outer kernel tap, the input line from the
    /// run's first to its last read position; with `lead`, also the value before a line whose
    /// run starts in the padding (see [`Source::prefetch_indices`]).
    pub(crate) fn prefetch(&self, runs: &[Run], channels: std::ops::Range<usize>, lead: bool) {
        self.prefetch_indices(runs, channels, lead, |i| {
            core_blas::pack::prefetch_l2(self.x, i)
        });
    }

    /// The indices into x that [`Source::prefetch`] hints, each handed to `f`: per run,
    /// channel and outer kernel tap, one per 16 values of the input line from the run's first
    /// to its last read position, and that last one; with `lead`, first the value just before
    /// the line's first position when the run starts in the padding (the fused step-2 tile's
    /// masked window begins there and its load touches that cache line, though no lane is
    /// read from it: on row 0 of a channel plane the previous plane's last line, which
    /// nothing else brings in, and each such miss stalls the tile. Fused stride-2 forward,
    /// 8 × 128@56² → 28², the first tile of each pass over an image's first column block
    /// took 3.1-3.3× a plain tile with or without the other hints, 1.8-1.9× with this one).
    pub(crate) fn prefetch_indices(
        &self,
        runs: &[Run],
        channels: std::ops::Range<usize>,
        lead: bool,
        mut f: impl FnMut(usize),
    ) {
        let d = &self.d;
        let (s2, k2) = (d.stride[2], (d.kernel[2] - 1) * d.dilation[2]);
        for run in runs {
            let first = (run.o2 * s2) as isize - d.pad[2] as isize;
            let lo = first.max(0) as usize;
            let hi = ((first + ((run.len - 1) * s2 + k2) as isize) as usize).min(d.input[2] - 1);
            if (first + ((run.len - 1) * s2 + k2) as isize) < 0 || lo >= d.input[2] {
                continue;
            }
            for t in 0..d.kernel[0] {
                let i0 = (run.o0 * d.stride[0] + t * d.dilation[0]) as isize - d.pad[0] as isize;
                if i0 < 0 || i0 >= d.input[0] as isize {
                    continue;
                }
                for r in 0..d.kernel[1] {
                    let i1 =
                        (run.o1 * d.stride[1] + r * d.dilation[1]) as isize - d.pad[1] as isize;
                    if i1 < 0 || i1 >= d.input[1] as isize {
                        continue;
                    }
                    let line =
                        run.n * self.image + (i0 as usize * d.input[1] + i1 as usize) * d.input[2];
                    for c in channels.clone() {
                        let base = self.plane(c) + line;
                        if lead && first < 0 && base + lo > 0 {
                            f(base + lo - 1);
                        }
                        let mut i = base + lo;
                        while i <= base + hi {
                            f(i);
                            i += 16;
                        }
                        f(base + hi);
                    }
                }
            }
        }
    }

    /// Debug check of what the packers' unsafe copies rely on: every segment of every channel
    /// plane in `planes` reads inside x (each `at` moved by `shift`), and lies inside its run.
    pub(crate) fn segments_in_bounds(
        &self,
        runs: &[Run],
        segs: &[Seg],
        planes: &[usize],
        shift: usize,
    ) -> bool {
        let s = self.d.stride[2];
        // Every plane offset is checked through the largest: the check is linear in the
        // segments, not their product with the planes (it dominated debug-assertion test runs).
        let Some(&last) = planes.iter().max() else {
            return segs
                .iter()
                .zip(runs.iter().cycle())
                .all(|(g, r)| g.lo <= g.hi && g.hi <= r.len);
        };
        segs.iter().zip(runs.iter().cycle()).all(|(g, r)| {
            g.lo <= g.hi
                && g.hi <= r.len
                && (g.hi == g.lo || last + g.at + shift + (g.hi - g.lo - 1) * s < self.x.len())
        })
    }
}

/// The micro-panels of a packed block in core-blas's layout: for each `r`-wide panel of the
/// `len` indices from `start`, `(first index, width ≤ r, the panel's depth · r values)`.
pub(crate) fn micro_panels(
    dst: &mut [f32],
    depth: usize,
    r: usize,
    start: usize,
    len: usize,
) -> impl Iterator<Item = (usize, usize, &mut [f32])> {
    dst.chunks_exact_mut(depth * r)
        .take(len.div_ceil(r))
        .enumerate()
        .map(move |(q, panel)| {
            let first = start + q * r;
            (first, r.min(start + len - first), panel)
        })
}

/// Copies `n` values from `src` (every `stride`-th) to `dst`: the short runs of narrow images
/// in fixed 8-value chunks the compiler turns into vector moves (a call into the C library's
/// memcpy costs more than a 7-16 value copy), the tail as one overlapping chunk.
///
/// # Safety
/// `dst` must be valid for `n` writes and `src` for reads at `t·stride`, `t < n`; they must
/// not overlap.
#[inline(always)]
pub(crate) unsafe fn copy_run(dst: *mut f32, src: *const f32, n: usize, stride: usize) {
    // SAFETY: offsets stay below `n` (writes) and `(n − 1)·stride + 1` (reads): the caller's
    // contract.
    unsafe {
        if stride == 2 && n >= 5 {
            // Four values from each 8-value load (even lanes: `shufps` on SSE2); a chunk at
            // t reads src[2t .. 2t + 8), inside the contract while t + 5 <= n. The last value
            // alone.
            let chunk = |t: usize| {
                let v = src.add(2 * t).cast::<[f32; 8]>().read_unaligned();
                dst.add(t)
                    .cast::<[f32; 4]>()
                    .write_unaligned([v[0], v[2], v[4], v[6]]);
            };
            let mut t = 0;
            while t + 5 <= n {
                chunk(t);
                t += 4;
            }
            if t < n - 1 {
                chunk(n - 5);
            }
            *dst.add(n - 1) = *src.add(2 * (n - 1));
        } else if stride != 1 {
            for t in 0..n {
                *dst.add(t) = *src.add(t * stride);
            }
        } else if n >= 8 {
            let mut i = 0;
            while i + 8 <= n {
                let v = src.add(i).cast::<[f32; 8]>().read_unaligned();
                dst.add(i).cast::<[f32; 8]>().write_unaligned(v);
                i += 8;
            }
            if i < n {
                let v = src.add(n - 8).cast::<[f32; 8]>().read_unaligned();
                dst.add(n - 8).cast::<[f32; 8]>().write_unaligned(v);
            }
        } else if n >= 4 {
            let a = src.cast::<[f32; 4]>().read_unaligned();
            let b = src.add(n - 4).cast::<[f32; 4]>().read_unaligned();
            dst.cast::<[f32; 4]>().write_unaligned(a);
            dst.add(n - 4).cast::<[f32; 4]>().write_unaligned(b);
        } else {
            for t in 0..n {
                *dst.add(t) = *src.add(t);
            }
        }
    }
}
