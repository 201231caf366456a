//! Cache blocking: MC, KC, NC per kernel family, derived from the running CPU's caches.
//!
//! BLIS's reasoning, in our row-major orientation: a packed `kc × NR` micro-panel of B is reused
//! by every A micro-panel of the macro-kernel and should stay in L1 (together with the streaming A
//! micro-panel and the C tile), so `KC ≈ share_l1 · L1 / (NR · 4)`; the packed `mc × kc` block of A
//! is reused for every B micro-panel and should stay in L2, so `MC ≈ share_l2 · L2 / (KC · 4)`;
//! the packed `kc × nc` block of B is reused for every A block and lives in L3:
//! `NC ≈ share_l3 · L3 / (KC · 4)`. The shares and fallbacks live in [`TABLE`], one row per family;
//! [`crate::Gemm::with_block_sizes`] replaces them (the driver still adapts them to each product);
//! [`crate::Gemm::with_exact_block_sizes`] and the `CORE_BLAS_MC/KC/NC` variables override them
//! exactly ([`Exact`]).

use std::sync::OnceLock;

use crate::{Error, Isa};

/// Loop strides of the five-loop driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    /// Rows of the packed A block (loop ic). Rounded up to a multiple of MR by the driver.
    pub mc: usize,
    /// Depth of the packed blocks (loop pc). The driver splits k into equal passes of at most
    /// `kc`, or of at most `kc + kc / 8` when that takes two or three passes down by one.
    pub kc: usize,
    /// Columns of the packed B block (loop jc). Rounded up to a multiple of NR by the driver.
    pub nc: usize,
}

impl BlockSizes {
    /// The depth of each of the equal passes the driver splits a product of depth `k` into
    /// (see [`kc`](BlockSizes::kc)): at most `kc`, or at most `kc + kc / 8` when that takes two
    /// or three passes down by one; at least 1. Callers that shape their own K blocks (conv-ops'
    /// tap groups) read the driver's split here.
    pub fn pass_depth(&self, k: usize) -> usize {
        let kc = self.kc.max(1);
        let passes = match k.div_ceil(kc).max(1) {
            p @ 2..=3 => k.div_ceil(kc + kc / 8).min(p),
            p => p,
        };
        k.div_ceil(passes).max(1)
    }

    /// Check that every block size is positive and small enough to allocate.
    pub fn validate(self) -> Result<Self, Error> {
        for (arg, value) in [("mc", self.mc), ("kc", self.kc), ("nc", self.nc)] {
            if value == 0 {
                return Err(Error::BlockSize {
                    arg,
                    value,
                    reason: "must be positive",
                });
            }
            if value > 1 << 20 {
                return Err(Error::BlockSize {
                    arg,
                    value,
                    reason: "must be at most 2^20",
                });
            }
        }
        if self.mc.saturating_mul(self.kc) > 1 << 26 || self.kc.saturating_mul(self.nc) > 1 << 28 {
            return Err(Error::BlockSize {
                arg: "kc",
                value: self.kc,
                reason: "packed blocks would exceed 1 GiB",
            });
        }
        Ok(self)
    }
}

/// Which block sizes of a [`crate::Gemm`] the driver runs exactly as given (an explicit
/// override: [`crate::Gemm::with_exact_block_sizes`], the `CORE_BLAS_MC/KC/NC` variables), where
/// it otherwise adapts them to the product: the deeper passes of kernels with
/// `DEEPER_PASSES` (KC 4/3 deeper, MC as much shorter, with several A blocks), k and m split
/// into equal blocks, and for one A block the B block's width capped by the L2 budget (or
/// rounded to whole packing groups).
///
/// Exact KC runs passes of `kc` over k (the last one shorter); exact MC A blocks of `mc` rows
/// rounded up to the tile's MR (the last one shorter); exact NC B blocks of `nc` columns rounded
/// up to NR. A store that needs the whole k in one pass still raises KC to k.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Exact {
    pub(crate) mc: bool,
    pub(crate) kc: bool,
    pub(crate) nc: bool,
}

impl Exact {
    /// Every size exact.
    pub(crate) const ALL: Self = Self {
        mc: true,
        kc: true,
        nc: true,
    };
}

/// Data cache sizes in bytes, per instance (L3: the instance this core shares).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheSizes {
    /// L1 data cache.
    pub l1d: usize,
    /// L2 cache.
    pub l2: usize,
    /// L3 cache.
    pub l3: usize,
}

impl CacheSizes {
    /// Used when the OS does not tell: Zen 4 per core (32 KiB, 1 MiB) and 32 MiB L3.
    pub const FALLBACK: Self = Self {
        l1d: 32 << 10,
        l2: 1 << 20,
        l3: 32 << 20,
    };

    /// The running CPU's caches (Linux sysfs, cpu0), detected once; [`Self::FALLBACK`] elsewhere.
    pub fn detect() -> Self {
        static CACHES: OnceLock<CacheSizes> = OnceLock::new();
        *CACHES.get_or_init(|| read_sysfs().unwrap_or(Self::FALLBACK))
    }
}

fn read_sysfs() -> Option<CacheSizes> {
    let mut found = CacheSizes {
        l1d: 0,
        l2: 0,
        l3: 0,
    };
    for index in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
        let Ok(level) = std::fs::read_to_string(format!("{dir}/level")) else {
            break;
        };
        let kind = std::fs::read_to_string(format!("{dir}/type")).ok()?;
        let size = std::fs::read_to_string(format!("{dir}/size")).ok()?;
        let size = size.trim();
        let bytes = if let Some(kib) = size.strip_suffix('K') {
            kib.parse::<usize>().ok()? << 10
        } else if let Some(mib) = size.strip_suffix('M') {
            mib.parse::<usize>().ok()? << 20
        } else {
            size.parse::<usize>().ok()?
        };
        match (level.trim(), kind.trim()) {
            ("1", "Data") => found.l1d = bytes,
            ("2", _) => found.l2 = bytes,
            ("3", _) => found.l3 = bytes,
            _ => {}
        }
    }
    (found.l1d > 0 && found.l2 > 0).then_some(CacheSizes {
        l3: if found.l3 > 0 {
            found.l3
        } else {
            CacheSizes::FALLBACK.l3
        },
        ..found
    })
}

/// One row of the blocking table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FamilyBlocking {
    pub(crate) isa: Isa,
    /// Fraction of L1 for the B micro-panel (`KC · NR · 4` bytes).
    pub(crate) l1_share: f64,
    /// Fraction of L2 for the A block (`MC · KC · 4` bytes).
    pub(crate) l2_share: f64,
    /// Fraction of L3 for the B block (`KC · NC · 4` bytes).
    pub(crate) l3_share: f64,
    /// Limits on KC (a longer k-loop amortises the C tile, a shorter one fits the caches).
    pub(crate) kc_range: (usize, usize),
    /// Upper limit on NC.
    pub(crate) nc_max: usize,
}

/// The blocking table: one row per kernel family.
pub(crate) const TABLE: [FamilyBlocking; 4] = [
    FamilyBlocking {
        isa: Isa::Scalar,
        l1_share: 0.5,
        l2_share: 0.5,
        l3_share: 0.25,
        kc_range: (64, 512),
        nc_max: 4096,
    },
    FamilyBlocking {
        isa: Isa::Avx2,
        l1_share: 0.5,
        l2_share: 0.5,
        l3_share: 0.25,
        kc_range: (128, 512),
        nc_max: 4096,
    },
    // The B micro-panel (`KC × 32`) streams from L2 here, as the 32-wide panel of BLIS's SKX
    // sgemm does (KC 384 there too): on the 12 × 32 tile each step reads 128 bytes of B per 24
    // FMAs, which L2 sustains, and the deeper pass halves the C-tile traffic of KC = 192.
    // Session 11, Xeon (Cascade Lake, L1 32 KiB, L2 1 MiB), gemm_ratio 1 thread, quiet 14:48
    // and 15:03 UTC: 2048³ KC 128 / 192 / 256 / 384 = 39.0 / 41.7 / 45.0-46.8 / 47.4-48.8% of
    // the peak; 64×50176×576 26.8 / 27.7 / 28.1-28.5 / 29.0-29.3%; 256×3136×2304 within noise.
    // Session 13, 8 × 48 tile: the B micro-panel (`KC × 48`, 72 KiB at KC 384) streams from L2 as
    // the 32-wide one did; l1_share 2.25 keeps KC 384 (MC 336). gemm_ratio 1 thread, quiet 21:08
    // UTC, two rounds, KC / MC 384 / 336, 256 / 512, 192 / 672, 128 / 1024: 2048³ 61.8-64.8,
    // 53.7-61.0, 57.7-58.0, 50.7-57.8% of the peak; 64×50176×576 38.4-40.0, 36.5-36.9,
    // 30.5-33.3, 35.4-36.8%; 256×3136×2304 50.9-54.9, 53.3-53.7, 56.0-60.8, 47.8-52.3%.
    FamilyBlocking {
        isa: Isa::Avx512,
        l1_share: 2.25,
        l2_share: 0.5,
        l3_share: 0.25,
        kc_range: (128, 512),
        nc_max: 4096,
    },
    FamilyBlocking {
        isa: Isa::Neon,
        l1_share: 0.5,
        l2_share: 0.5,
        l3_share: 0.25,
        kc_range: (64, 512),
        nc_max: 4096,
    },
];

/// Block sizes for a family with register tile `mr × nr` on caches `caches`.
pub(crate) fn derive(isa: Isa, mr: usize, nr: usize, caches: CacheSizes) -> BlockSizes {
    let row = TABLE
        .iter()
        .find(|r| r.isa == isa)
        .copied()
        .unwrap_or(TABLE[0]);
    let f = 4.0; // bytes per f32
    let kc = (row.l1_share * caches.l1d as f64 / (nr as f64 * f)) as usize;
    let kc = (kc / 8 * 8).clamp(row.kc_range.0, row.kc_range.1);
    let mc = (row.l2_share * caches.l2 as f64 / (kc as f64 * f)) as usize;
    let mc = (mc / mr * mr).max(mr);
    let nc = (row.l3_share * caches.l3 as f64 / (kc as f64 * f)) as usize;
    let nc = (nc.min(row.nc_max) / nr * nr).max(nr);
    BlockSizes { mc, kc, nc }
}
