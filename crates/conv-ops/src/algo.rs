//! Algorithm choices per pass, the presets of the convgemm paper's Table 2, and the workspace
//! each choice needs.

use std::fmt;
use std::str::FromStr;

use crate::ConvError;
use crate::geometry::ConvGeometry;

/// How to compute the forward pass y = conv(x, w).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardAlgo {
    /// Explicit im2col(x) buffer, then GEMM (`base`).
    Im2colGemm,
    /// im2col fused into the packing of B: no buffer (convgemm).
    Convgemm,
    /// Direct convolution (no GEMM, no packed B): output channels × runs of output pixels in
    /// registers, x read in place from a per-image padded copy; for layers with few channels.
    Direct,
}

/// How to compute the data gradient dx.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackwardDataAlgo {
    /// GEMM Wᵀ·dY into an explicit buffer, then col2im (`base`, `rdx`, `cgt`).
    GemmCol2im,
    /// col2im fused into the store of C: no buffer (deconvgemm, `cgt+dg`).
    Deconvgemm,
    /// Stride 1 only: convgemm of dy with the flipped, channel-transposed kernel (the transposed
    /// convolution as a forward one), whose A operand is packed straight from w (no
    /// workspace).
    FlippedConvgemm,
    /// Stride 1 only: the same transposed convolution run by the direct convolution
    /// ([`ForwardAlgo::Direct`]), which packs the flipped weights straight from w (no
    /// workspace).
    FlippedDirect,
}

/// How to compute the weight gradient dw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackwardFilterAlgo {
    /// Explicit im2col(x) buffer, then dY·im2col(x)ᵀ (`base`).
    Im2colGemmT,
    /// The Reindex transform of x into an explicit buffer, then convgemm on it (`rdx`).
    ReindexConvgemm,
    /// im2col(x)ᵀ packed straight from x: no buffer (transposed convgemm, `cgt`).
    ConvgemmTrans,
    /// Direct (no GEMM, no packing): dot products over the output pixels of dy rows with x
    /// read in place from per-image padded copies ([`ForwardAlgo::Direct`]'s), 3 output
    /// channels × 4 (input channel, tap) columns per register tile; for layers with few
    /// channels.
    Direct,
}

/// One of the three passes of a convolution layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    /// y = conv(x, w).
    Forward(ForwardAlgo),
    /// dx from dy and w.
    BackwardData(BackwardDataAlgo),
    /// dw from x and dy.
    BackwardFilter(BackwardFilterAlgo),
}

impl Pass {
    /// Every pass with every algorithm conv-ops has for it, forward first (for benches and
    /// tests that cover them all).
    pub const ALL: [Pass; 11] = [
        Pass::Forward(ForwardAlgo::Im2colGemm),
        Pass::Forward(ForwardAlgo::Convgemm),
        Pass::Forward(ForwardAlgo::Direct),
        Pass::BackwardData(BackwardDataAlgo::GemmCol2im),
        Pass::BackwardData(BackwardDataAlgo::Deconvgemm),
        Pass::BackwardData(BackwardDataAlgo::FlippedConvgemm),
        Pass::BackwardData(BackwardDataAlgo::FlippedDirect),
        Pass::BackwardFilter(BackwardFilterAlgo::Im2colGemmT),
        Pass::BackwardFilter(BackwardFilterAlgo::ReindexConvgemm),
        Pass::BackwardFilter(BackwardFilterAlgo::ConvgemmTrans),
        Pass::BackwardFilter(BackwardFilterAlgo::Direct),
    ];
}

/// The algorithm of every pass, plus whether workspaces persist across calls (`+pm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Preset {
    /// Forward algorithm.
    pub forward: ForwardAlgo,
    /// Backward-data algorithm.
    pub backward_data: BackwardDataAlgo,
    /// Backward-filter algorithm.
    pub backward_filter: BackwardFilterAlgo,
    /// Keep workspaces allocated between calls (`+pm`): faster, more memory.
    pub persistent: bool,
}

impl Preset {
    /// `base`: explicit im2col / col2im everywhere.
    pub const BASE: Preset = Preset {
        forward: ForwardAlgo::Im2colGemm,
        backward_data: BackwardDataAlgo::GemmCol2im,
        backward_filter: BackwardFilterAlgo::Im2colGemmT,
        persistent: false,
    };
    /// `rdx`: convgemm forward, Reindex + convgemm for dw, GEMM + col2im for dx.
    pub const RDX: Preset = Preset {
        forward: ForwardAlgo::Convgemm,
        backward_data: BackwardDataAlgo::GemmCol2im,
        backward_filter: BackwardFilterAlgo::ReindexConvgemm,
        persistent: false,
    };
    /// `cgt`: convgemm forward, transposed convgemm for dw, GEMM + col2im for dx.
    pub const CGT: Preset = Preset {
        forward: ForwardAlgo::Convgemm,
        backward_data: BackwardDataAlgo::GemmCol2im,
        backward_filter: BackwardFilterAlgo::ConvgemmTrans,
        persistent: false,
    };
    /// `cgt+dg`: no workspace that grows with the batch in any pass.
    pub const CGT_DG: Preset = Preset {
        forward: ForwardAlgo::Convgemm,
        backward_data: BackwardDataAlgo::Deconvgemm,
        backward_filter: BackwardFilterAlgo::ConvgemmTrans,
        persistent: false,
    };
    /// The same preset with persistent workspaces (`+pm`).
    pub const fn pm(self) -> Preset {
        Preset {
            persistent: true,
            ..self
        }
    }
    /// The memory-lean preset for one geometry: `cgt+dg`'s fused algorithms (no workspace at
    /// all), each pass choosing the faster for `g`
    /// as measured on the layers of the conv-ops bench (docs/PERFORMANCE.md, session 5):
    /// - forward: [`ForwardAlgo::Direct`] when [`direct_applies`], or with AVX-512's wide GEMM
    ///   tile on 2-D layers of 97-128 channels with output lines of at least 28 (measured
    ///   faster there), else convgemm;
    /// - backward-data: [`BackwardDataAlgo::FlippedDirect`] when the transposed (stride-1)
    ///   form exists and [`direct_applies`]; else the flipped convgemm for stride-1 "same"
    ///   convolutions (output at least as large as the input), deconvgemm otherwise;
    /// - backward-filter: [`BackwardFilterAlgo::Direct`] when [`direct_applies`] with at most
    ///   64 input and output channels per group (wider layers were not measured with it) and an
    ///   image's zero-padded input (one group) is at most 512 KiB (ResNet-20's and LeNet's
    ///   layers: 1.01-2.1× faster than the transposed convgemm at 1 thread, 1.3-3.1× at 2),
    ///   else the transposed convgemm (on large images, ResNet-50's 64@56², VGG's 64@224²,
    ///   C3D's 64@8×56², the two are within 7%: direct 1.01-1.07× faster at 1 thread,
    ///   0.85-1.12× at 2; measured 2026-11-22 01:23-02:01 UTC, docs/PERFORMANCE.md).
    pub fn lean_for(g: &ConvGeometry) -> Preset {
        let flipped = crate::flipped::transposed_geometry(g).is_ok();
        let same = g.output_spatial_len() >= g.input_spatial_len();
        Preset {
            forward: if direct_applies(g) || direct_forward_wins(g) {
                ForwardAlgo::Direct
            } else {
                ForwardAlgo::Convgemm
            },
            backward_data: if flipped && direct_applies(g) {
                BackwardDataAlgo::FlippedDirect
            } else if flipped && same {
                BackwardDataAlgo::FlippedConvgemm
            } else {
                BackwardDataAlgo::Deconvgemm
            },
            backward_filter: if direct_applies(g)
                && g.in_channels_per_group() <= 64
                && g.out_channels_per_group() <= 64
                && padded_image_bytes(g) <= 512 << 10
            {
                BackwardFilterAlgo::Direct
            } else {
                BackwardFilterAlgo::ConvgemmTrans
            },
            persistent: false,
        }
    }

    /// The three passes of this preset.
    pub fn passes(&self) -> [Pass; 3] {
        [
            Pass::Forward(self.forward),
            Pass::BackwardData(self.backward_data),
            Pass::BackwardFilter(self.backward_filter),
        ]
    }
}

/// Whether the direct convolution is the faster lean algorithm for `g` (forward, and the
/// flipped backward-data of stride-1 layers): a kernel larger than 1×1 (a 1×1 kernel has too
/// few multiply-adds per input value to pay for the padded copy: ResNet-20's 1×1 stride-2
/// projections run 1.3-1.8× slower direct) and at most 64 input and output channels per group,
/// or at most 128 when the direct plan's output runs are flat (output lines laid out at the
/// input line pitch, so that 28-wide lines fill 28 of 29 lanes instead of 28 of 32) on output
/// lines of at least 16 values (the measured range; shorter lines keep the GEMM forms).
/// Measured: from 128 channels on with per-line runs, convgemm's blocked GEMM is as fast or
/// faster (ResNet-50's 256@14² 1.18×, 512@7² 1.26× slower direct, 2026-11-21 23:30 UTC); with
/// flat runs ResNet-50's 128@28² runs 0.93× convgemm's time forward and 0.97× the flipped
/// convgemm's backward-data, its stride-2 128@56² 0.97× forward (session 8, docs/PERFORMANCE.md),
/// while 256@14² gains nothing from flat runs (27 runs per plane against 28).
///
/// From 128 output channels per group on, when an image's padded copy fits the direct plan's
/// block of images, the direct forward runs pixel tiles (6 output pixels at any bases × 16
/// output channels of a packed Wᵀ panel: core-blas's offset-A tile, no lane lost on narrow
/// lines; see `direct::tiles_for`), which changes no choice here: on ResNet-50's 256@14² they ran
/// 0.96× the GEMM forms' time at 1 thread in thread-CPU probes but 0.98-1.25× in criterion's
/// wall clock and 1.03-1.10× at 2 threads, and on 512@7² 1.06-1.14× (session 10,
/// docs/PERFORMANCE.md), so those layers keep the GEMM forms.
///
/// All of the above was measured with AVX2 GEMM tiles (NR 16). When the GEMM's tile is wider
/// than 16 channels (core-blas's offset tiles were 256-bit then: 8-pixel vectors, Wᵀ rows of
/// 16 channels), as with the AVX-512 family (NR 32), the GEMM
/// forms win from 32 input channels on, and the direct convolution applies only to at most
/// 16 input and 32 output channels per group. Measured on the Intel AVX-512 Xeon (probe,
/// thread CPU, 1 thread, min of 5, session 11, 15:01-15:03 UTC, docs/PERFORMANCE.md): direct /
/// convgemm forward ResNet-20 32@16² 18.8 / 14.2 ms, 64@8² 16.3 / 11.9, 16@32² 12.8 / 12.4,
/// 16→32 stride 2 8.8 / 9.5, LeNet c2 1.08 / 1.44; ResNet-50 64@56² 56.1 / 36.4, 128@28²
/// 56.6 / 29.9, VGG 64@224² 131 / 85, C3D 64@8×56² 162 / 120.
///
/// Kept for core-blas's wide offset tile (AVX-512 since session 41: 8 channels × runs of 16
/// pixels, 2 × 16 = 32 lanes of output, the GEMM tile's NR). Measured on the Intel Xeon Emerald
/// Rapids (probe_passes, thread CPU, 1 thread, min of 10 rounds, batch 64, quiet 17:44:40 UTC
/// session 41), direct (the better of wide channel tiles and pixel tiles, `direct::tiles_for`)
/// / convgemm forward: ResNet-20 16@32² 0.87-0.91, 16→32 stride 2 0.81-0.88 (inside the rule);
/// 32@16² 0.90-0.95 but its flipped backward-data 0.96-1.13 (level; its direct backward-filter
/// not measured), 32→64 stride 2 1.24-1.26, 64@8² 1.17-1.46 (outside).
pub fn direct_applies(g: &ConvGeometry) -> bool {
    let (cg, kg) = (g.in_channels_per_group(), g.out_channels_per_group());
    if gemm_wider_than_direct() {
        return g.kernel_len() > 1 && cg <= 16 && kg <= 32;
    }
    g.kernel_len() > 1
        && ((cg <= 64 && kg <= 64)
            || (cg <= 128
                && kg <= 128
                && g.output().last().is_some_and(|&w| w >= 16)
                && crate::direct::flat_line_pitch(g).is_some()))
}

/// Whether the direct forward (pixel tiles) beats convgemm on `g` where [`direct_applies`]
/// does not hold: with the wide GEMM tile (AVX-512), 2-D layers of one group with 97-128
/// input and output channels on output lines of at least 28 (ResNet-50's 128@28² and its
/// stride-2 128@56²), forward only. Measured on the Zen 4 (AVX-512, 8×48 GEMM tile; probe,
/// thread-CPU min of 3 rounds, 1 thread, convgemm / direct alternating, quiet 03:50:02 UTC
/// session 21, ms): 128@28² 17.95 / 17.37, 17.89 / 17.18, 17.78 / 17.31 (0.97×); stride-2
/// 128@56² 19.12 / 18.91, 19.36 / 18.49, 19.10 / 18.83 (0.98×). Not taken: 64@56² (level:
/// 19.63 / 20.15, 18.84 / 20.19, 18.65 / 18.26), 256@14² (slower: 19.2 against 19.9-20.2, quiet
/// 03:33:23), VGG's 64@224² (38.2 against 48.7, quiet 03:25), and 128@28²'s backward-data
/// (the flipped direct 17.39-19.29 against the flipped convgemm's 17.80-17.97).
pub(crate) fn direct_forward_wins(g: &ConvGeometry) -> bool {
    let (cg, kg) = (g.in_channels_per_group(), g.out_channels_per_group());
    gemm_wider_than_direct()
        && g.rank() == 2
        && g.groups() == 1
        && g.kernel_len() > 1
        && (97..=128).contains(&cg)
        && (97..=128).contains(&kg)
        && g.output().last().is_some_and(|&w| w >= 28)
}

/// Whether the process-wide GEMM's register tile is wider than 16 channels, the width the
/// rules of [`direct_applies`] were measured at (NR 32 on AVX-512). core-blas's offset-A tile
/// is 32 channels wide there too since session 12, but the direct convolution with it still
/// ran level with or behind the GEMM forms on 32-128-channel layers (probe, 1 thread, quiet
/// 17:40-17:43 UTC, direct with pixel tiles / convgemm forward: ResNet-50 64@56² 32.2 / 28.7
/// ms, 128@28² 32.5 / 30.5, 256@14² 34.0 / 27.1, VGG 67.8 / 66.4, C3D 96.0 / 72.9; ResNet-20
/// 32@16² 13.6-15.8 / 11.4-13.8, 64@8² 12.4-14.1 / 9.3-12.8), so the restricted rule stays.
fn gemm_wider_than_direct() -> bool {
    core_blas::Gemm::global().is_ok_and(|gemm| gemm.tile().1 > 2 * core_blas::OFFSET_LANES)
}

/// Bytes of one image's zero-padded input for one group (C/G × Π (input + padding) floats).
fn padded_image_bytes(g: &ConvGeometry) -> usize {
    (0..g.rank())
        .map(|d| g.input()[d] + g.pad_before()[d] + g.pad_after()[d])
        .fold(g.in_channels_per_group() * size_of::<f32>(), |a, v| {
            a.saturating_mul(v)
        })
}

impl FromStr for Preset {
    type Err = ConvError;
    /// `base`, `rdx`, `cgt`, `cgt+dg`, each optionally followed by `+pm`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, pm) = match s.strip_suffix("+pm") {
            Some(name) => (name, true),
            None => (s, false),
        };
        let p = match name {
            "base" => Preset::BASE,
            "rdx" => Preset::RDX,
            "cgt" => Preset::CGT,
            "cgt+dg" => Preset::CGT_DG,
            _ => {
                return Err(ConvError::Unsupported {
                    algo: "preset",
                    reason: format!(
                        "unknown preset `{s}` (expected base, rdx, cgt or cgt+dg, optionally +pm)"
                    ),
                });
            }
        };
        Ok(if pm { p.pm() } else { p })
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match (self.forward, self.backward_data, self.backward_filter) {
            (
                ForwardAlgo::Im2colGemm,
                BackwardDataAlgo::GemmCol2im,
                BackwardFilterAlgo::Im2colGemmT,
            ) => "base",
            (
                ForwardAlgo::Convgemm,
                BackwardDataAlgo::GemmCol2im,
                BackwardFilterAlgo::ReindexConvgemm,
            ) => "rdx",
            (
                ForwardAlgo::Convgemm,
                BackwardDataAlgo::GemmCol2im,
                BackwardFilterAlgo::ConvgemmTrans,
            ) => "cgt",
            (
                ForwardAlgo::Convgemm,
                BackwardDataAlgo::Deconvgemm,
                BackwardFilterAlgo::ConvgemmTrans,
            ) => "cgt+dg",
            _ => "custom",
        };
        write!(f, "{name}{}", if self.persistent { "+pm" } else { "" })
    }
}

/// Bytes of workspace that `conv-ops` allocates for one pass beyond its inputs and outputs:
/// the im2col / GEMM-result buffer of the `base` algorithms (one group at a time), the Reindex
/// buffer of `rdx`, zero for the fused algorithms (and [`BackwardDataAlgo::FlippedConvgemm`] /
/// [`BackwardDataAlgo::FlippedDirect`], whose packed weights are built from w directly). Not counted: the GEMM's packing buffers
/// (per thread, bounded by the cache blocking, independent of the batch), the tables of the
/// panels packed from x by [`crate::Im2colB`] (convgemm's B: per thread and kept across calls,
/// shared by every layer and pass the thread runs, at most [`crate::PANEL_TABLE_BYTES`] in all,
/// whatever the batch and the layer; [`crate::panel_table_bytes`] counts what they hold, to
/// the byte, and [`crate::release_workspaces`] frees them), the chunk table of the panels
/// [`crate::Im2colTB`] packs for the transposed convgemm's backward-filter on output planes of
/// at most 1024 positions and strided layers (per thread and kept across calls, one chunk per
/// output position of an image and tap: at most 65536 chunks of 24 bytes and their gathers'
/// index rows, independent of the batch; [`crate::release_workspaces`] frees it), the micro-tile
/// the store receives, and the C panel of deconvgemm and of the forward convgemm on small
/// output planes (one per thread, kept in thread-local storage across calls: at most 128 Ki
/// floats, or K/G × 4·NR, or one output line by one channel's taps, whichever is largest;
/// independent of the batch), the forward convgemm's weights packed once per call when its
/// product on small output planes runs in several C panels or row classes (one group's w
/// rounded up to whole micro-panels, in the calling thread's storage, kept across calls; the
/// row classes also allocate one packed micro-panel of w per packing thread during the call;
/// independent of the batch), the direct convolution's padded copy of one image's group and
/// its packed weights (per thread and per call, independent of the batch), and the direct
/// backward-filter's padded copies of a block of images (about 256 KiB), their dy rows, and
/// one dw partial sum per extra thread (per thread or per call, independent of the batch), and,
/// for 1×1 strided layers (ResNet's downsampling shortcuts) under the fused algorithms, the
/// subsampled input of a block of images (per thread, kept across calls: about 64 Ki floats, or
/// 512 output columns' worth of input channels, or one image's, whichever is largest; the
/// backward-data's result block lives in the C panel above) and one dw partial per extra thread,
/// and, for tiny planes (one group, input plane at most as large as the kernel, e.g. 2×2 under
/// 3×3: `tapwise`), under the fused algorithms, per-thread copies kept across calls of w tap
/// by tap (the size of w, rows padded to 16) and of one block of images' input and output side
/// position by position (256 Ki floats each, or one image's side if larger; independent of the
/// batch: VGG-16's 512@2² runs in blocks of 128 images), and, for layers of at least 256
/// input and output channels on small planes with at least 12% of the (position, tap) pairs
/// in the padding (stride 1, one group, e.g. ResNet-50's 512@7²: `tapsum`), under the forward
/// convgemm and the backward-data algorithms, per-thread copies kept across calls of w by tap
/// (the size of w) and of one block of images' input and output side position by position
/// (256 Ki floats each, or one image's side if larger: 512@7² runs in blocks of 10 images),
/// and, for strided 2-D layers of at least 64 input channels and 512 to 1023 output positions
/// (one group, e.g. ResNet-50's 128@56² stride 2) under the forward convgemm, a per-thread copy
/// of one block of images' input split into its stride phases (kept across calls: about 512 Ki
/// floats, or one image's input if larger; independent of the batch) and w packed once per call
/// (in the calling thread's storage, kept across calls),
/// and, for the transposed convgemm on
/// layers of a multiple of 16 input channels per group and output lines of at least 16
/// positions, a per-thread position-major copy of 16 channels of the input lines one packed
/// block of B reads (kept across calls: about KC / line length + kernel height lines of 16
/// values per input position, independent of the batch; on 3-D kernels instead one copy of a
/// block of images' whole input, in the calling thread's storage, kept across calls: about 1
/// Mi floats, or one image's input and its padding lines if larger, independent of the batch)
/// and a copy of 16 channels of one dw row (per call and thread).
pub fn workspace_bytes(g: &ConvGeometry, pass: Pass) -> usize {
    let (rows, cols) = crate::im2col::im2col_shape(g);
    let buffer = rows * cols * size_of::<f32>();
    match pass {
        Pass::Forward(ForwardAlgo::Convgemm)
        | Pass::Forward(ForwardAlgo::Direct)
        | Pass::BackwardData(BackwardDataAlgo::Deconvgemm)
        | Pass::BackwardFilter(BackwardFilterAlgo::ConvgemmTrans)
        | Pass::BackwardFilter(BackwardFilterAlgo::Direct)
        | Pass::BackwardData(BackwardDataAlgo::FlippedConvgemm)
        | Pass::BackwardData(BackwardDataAlgo::FlippedDirect) => 0,
        Pass::Forward(ForwardAlgo::Im2colGemm)
        | Pass::BackwardData(BackwardDataAlgo::GemmCol2im)
        | Pass::BackwardFilter(BackwardFilterAlgo::Im2colGemmT)
        | Pass::BackwardFilter(BackwardFilterAlgo::ReindexConvgemm) => buffer,
    }
}

/// A workspace for the algorithms that need one. With `persistent` (`+pm`) the buffer is kept
/// between calls (and grows to the largest request); otherwise it is freed after every call.
#[derive(Debug, Default)]
pub struct Workspace {
    buf: Vec<f32>,
    persistent: bool,
    peak_bytes: usize,
}

impl Workspace {
    /// An empty workspace; `persistent` keeps buffers across calls.
    pub fn new(persistent: bool) -> Self {
        Workspace {
            buf: Vec::new(),
            persistent,
            peak_bytes: 0,
        }
    }
    /// The workspace a preset asks for.
    pub fn for_preset(p: &Preset) -> Self {
        Self::new(p.persistent)
    }
    /// Bytes held right now.
    pub fn allocated_bytes(&self) -> usize {
        self.buf.capacity() * size_of::<f32>()
    }
    /// The most bytes ever held at once.
    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes
    }
    /// A buffer of exactly `len` values (contents unspecified).
    pub(crate) fn take(&mut self, len: usize) -> &mut [f32] {
        if self.buf.len() < len {
            self.buf.clear();
            self.buf.shrink_to_fit();
            self.buf.reserve_exact(len);
            self.buf.resize(len, 0.0);
        }
        self.peak_bytes = self.peak_bytes.max(self.allocated_bytes());
        &mut self.buf[..len]
    }
    /// End of a call: frees the buffer unless persistent.
    pub(crate) fn release(&mut self) {
        if !self.persistent {
            self.buf = Vec::new();
        }
    }
}
