//! The five-loop driver (BLIS `frame/3/gemm`): jc over n by NC, pc over k by KC (pack B into Bc),
//! ic over m by MC (pack A into Ac), then the macro-kernel: jr over NR micro-panels of Bc, ir over
//! MR micro-panels of Ac, one micro-kernel call per `MR × NR` tile.
//!
//! Threads (rayon) split the rows of C into `tm` ranges cut at MR multiples, and each row range's
//! NC-wide column blocks among `tn` threads: each thread owns an even, contiguous share of them
//! and runs it in order, and a thread that runs out takes the last blocks of another's share, one
//! at a time, so a thread that starts late or runs slow (a vCPU woken from sleep, a noisy
//! neighbour) ends up with fewer blocks instead of stalling the product by its delay. Each
//! thread runs the five loops on its blocks with its own thread-local, reused packing buffers (a
//! single A block packed once per thread, whichever blocks it runs). The grid minimises
//! redundant packing (`tm − 1` extra packings of B, `tn − 1` of A). Small products and 1-thread
//! pools run on the calling thread without touching rayon. The parts of a large parallel product
//! each run bound to a CPU of their own for its length (`crew.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::blocking::Exact;
use crate::crew::{self, Crew, Member};
use crate::kernel::convpack::ConvRows;
use crate::kernel::{Kernel, RowCopy, RowPrefetch};
use crate::pack::{PackA, PackB, Workspace, with_workspace};
use crate::store::{BiasRaw, DirectRaw, Store, Tile};
use crate::{BlockSizes, ConvPanel};

/// Below this many multiply-adds (`m · n · k`) a product stays on one thread.
pub(crate) const PAR_MIN_MNK: usize = 1 << 21;
/// Each thread should get at least this many multiply-adds.
const PAR_MIN_MNK_PER_THREAD: usize = 1 << 20;

/// A normal tile (not a packing one) whose share of the fused panel prefetch reaches this many
/// source rows hands them to its kernel ([`Kernel::run_prefetching`]: the AVX-512 family spreads
/// them over its k-loop) instead of issuing them right before it in one burst. Session 22,
/// avx512, `gemm_ratio` 1 thread, base / spread on every tile, quiet 06:43 UTC: operands on 2 MiB
/// pages (`--aligned`, as nn's tensors are) 64×50176×576 (36 rows a tile) 84.9/87.8, 88.6/91.6,
/// 81.6/87.5, 88.5/91.0%, `Vec` operands level (85.3/83.8, 79.9/82.3, 82.6/83.3, 82.3/82.3%);
/// but 256×3136×2304 (12 rows) and 2048³ (16 rows) lost 1-4 points on `Vec` operands (91.7/91.1,
/// 82.7/81.2, 90.2/86.4, 91.0/89.4%; 93.5/92.3, 95.0/93.4, 95.0/94.0, 94.7/93.8%): prefetches
/// inside the k-loop of lines on 4 KiB pages slow its tiles by 200-550 TSC cycles
/// (`CORE_BLAS_TT`, s22-blas-wip), more than the burst costs when it is short. Session 25, with
/// today's kernels (spread on every tile, i.e. from 1 row, against 24; avx512, quiet 17:17 and
/// 17:18 UTC, base/new): 256×3136×2304 (12 rows) `--aligned` 94.9/95.4, 94.7/95.8, 94.5/95.7,
/// 95.3/96.1, 95.5/96.6, 90.5/91.0%, `Vec` 88.3/89.2, 90.9/91.4, 90.1/88.8, 91.2/92.1,
/// 91.9/93.2, 91.9/92.6%; 2048³ (16 rows) level (`--aligned` 95.4/93.5, 96.5/96.7, 96.0/95.4,
/// 96.9/96.8, 96.5/97.2, 95.1/94.7%, `Vec` 94.0/94.4, 94.2/94.6, 93.8/93.8, 95.7/95.2,
/// 94.8/95.3, 95.6/95.4%); 2 threads level. Hence 12; shorter shares (not measured) keep the
/// burst.
pub(crate) const SPREAD_MIN_ROWS: usize = 12;

/// Rows ahead of the row it copies that a copying tile prefetches into L1 (`serial`'s
/// `copy_ahead`).
pub(crate) const COPY_AHEAD_ROWS: usize = 2;

/// Rows ahead of the row it copies that a copying tile prefetches toward L2.
pub(crate) const COPY_FAR_ROWS: usize = 16;

/// The fewest tiles of an A block whose panels' tiles copy the next panel (`copy_ahead`): with
/// fewer, each tile copies more rows than its k-loop has rounds.
pub(crate) const COPY_MIN_TILES: usize = 4;

/// Largest register tile (`MR · NR`) of any family: the size of the tile buffer for custom stores.
const MAX_TILE: usize = 1024;

/// Most threads of a product whose column blocks are shared (one share state each, on the
/// stack); products on more threads split the columns statically.
const MAX_SHARES: usize = 64;

/// `(pc, kc, jc, nc)` of a B block.
type BlockCoords = (usize, usize, usize, usize);

/// What the macro-kernel prefetches while it runs.
#[derive(Clone, Copy)]
enum Prefetch<'b, B> {
    /// The next B block, in slices over the jr steps (packed up front by `pack_b`).
    Block(&'b B, BlockCoords),
    /// One panel (or group of panels) ahead, for fused packing.
    Panels(&'b B, Ahead),
}

/// The panels a fused macro-kernel prefetches: the next panel of this block (depth pass `pc`)
/// when `within` (the first A block, whose tiles pack the panels), and after the last panel the
/// first one of the `next` block (before it, the `next` block's columns past its last whole
/// group, which are packed up front).
#[derive(Clone, Copy)]
struct Ahead {
    pc: usize,
    within: bool,
    next: Option<BlockCoords>,
}

/// Where tiles go: straight into a dense C, or through a store.
struct Sink<'s, S> {
    direct: Option<DirectRaw>,
    store: &'s S,
}

/// How many threads a product of this size should use, given a pool of `pool` threads.
pub(crate) fn plan_threads(m: usize, n: usize, k: usize, pool: usize) -> usize {
    let mnk = m.saturating_mul(n).saturating_mul(k.max(1));
    if pool <= 1 || mnk < PAR_MIN_MNK {
        return 1;
    }
    pool.min(mnk / PAR_MIN_MNK_PER_THREAD).max(1)
}

/// Split `nt` threads into `tm × tn` with the least redundant packing that leaves every thread
/// at least one micro-tile row and column.
fn grid(nt: usize, m: usize, n: usize, mr: usize, nr: usize) -> (usize, usize) {
    let (um, un) = (m.div_ceil(mr), n.div_ceil(nr));
    let mut best = (1, 1, usize::MAX);
    for tm in 1..=nt {
        if !nt.is_multiple_of(tm) {
            continue;
        }
        let tn = nt / tm;
        if tm > um || tn > un {
            continue;
        }
        let cost = (tm - 1) * n + (tn - 1) * m;
        if cost < best.2 {
            best = (tm, tn, cost);
        }
    }
    (best.0, best.1)
}

/// `[start, end)` of part `t` of `parts` over `len` elements, cut at multiples of `unit`.
fn part(len: usize, unit: usize, parts: usize, t: usize) -> (usize, usize) {
    let units = len.div_ceil(unit);
    let lo = (t * units / parts * unit).min(len);
    let hi = ((t + 1) * units / parts * unit).min(len);
    (lo, hi)
}

/// Run the product `C = A · B` (with whatever the store combines) on at most `max_threads`
/// threads. `bs` must be valid; `a`, `b`, `store` must agree on shapes (checked by the caller).
pub(crate) fn gemm<K: Kernel, A: PackA, B: PackB, S: Store>(
    kern: K,
    bs: BlockSizes,
    exact: Exact,
    a: &A,
    b: &B,
    store: &mut S,
    max_threads: usize,
) {
    let (m, k, n) = (a.rows(), a.cols(), b.cols());
    debug_assert_eq!(b.rows(), k);
    debug_assert_eq!((store.rows(), store.cols()), (m, n));
    if m == 0 || n == 0 {
        return;
    }
    let concurrent = store.concurrent();
    // A store that needs the whole k in one pass raises KC to k; MC and NC shrink so the packed
    // blocks keep their cache budgets (MC·KC and KC·NC), unless they are exact.
    let bs = if store.whole_k() && k > bs.kc {
        BlockSizes {
            kc: k,
            mc: if exact.mc {
                bs.mc
            } else {
                (bs.mc * bs.kc / k).max(1)
            },
            nc: if exact.nc {
                bs.nc
            } else {
                (bs.nc * bs.kc / k).max(1)
            },
        }
    } else {
        bs
    };
    let direct = store.direct().map(|d| d.raw);
    let sink = Sink {
        direct,
        store: &*store,
    };

    let nt = if concurrent
        && max_threads > 1
        && m.saturating_mul(n).saturating_mul(k.max(1)) >= PAR_MIN_MNK
    {
        plan_threads(m, n, k, max_threads.min(rayon::current_num_threads()))
    } else {
        1
    };
    let (tm, tn) = grid(nt, m, n, K::MR, K::NR);
    if tm * tn <= 1 {
        let cols = Columns {
            range: (0, n),
            threads: 1,
            own: 0,
            shares: &[AtomicU64::new(0)],
        };
        with_workspace(|ws| serial(kern, bs, exact, (0, m), cols, k, a, b, &sink, ws, None));
        return;
    }
    // The share states of the threads of every row range (`tn` each), or a static split of the
    // columns (each thread's part its own single share) beyond MAX_SHARES threads. Session 31,
    // avx512, `gemm_ratio 64 50176 576 2 20 --scale` (the second worker woken from sleep in each
    // pair, 1-5 ms late in up to a third of them: session 27), main / this, medians of 20 pairs
    // (lower quartiles), quiet 10:17:49 UTC: `Vec` 1.646/1.933 (1.526/1.635), 1.994/1.905
    // (1.880/1.631), 1.946/1.852 (1.587/1.672), 1.910/1.951 (1.661/1.607)×; 2 MiB pages
    // 1.798/1.798 (1.585/1.585), 1.909/1.778 (1.553/1.598), 1.671/1.873 (1.599/1.491),
    // 1.812/1.864 (1.510/1.748)×; the pool awake (`BACK=1`) 2.006/2.024, 1.991/2.001,
    // 1.978/2.004, 1.989/1.995×; 2048³ (two blocks, as before) 1.923/1.951, 1.980/1.914×. The
    // same schedule with the blocks handed out in order by one counter (s31-blas-wip; means of
    // six medians main / that 1.824/1.892× at quiet 09:42:28, 1.825/1.904× at 09:47:55) lost
    // the halves' locality on conv-ops' per-image products and, handing a block out ahead, gave
    // one thread both blocks of a two-block product (criterion, 2 threads, quiet 09:52:57:
    // ResNet-50 64@56² forward convgemm 8.85/9.27 ms, 128@28² backward-data bound 8.7/17.0 ms).
    let shares: [AtomicU64; MAX_SHARES] = [const { AtomicU64::new(0) }; MAX_SHARES];
    let shared = tn > 1 && tm * tn <= MAX_SHARES;
    // Each part of a large product runs bound to a CPU of its own, and the running parts yield
    // while one is late (crew.rs). Session 39, `gemm_ratio M N K 2 15 --scale`, unbound pools,
    // main / this, alternating in both orders: 64×50176×576 at quiet 11:43:32 UTC (main 50d8ea1)
    // `Vec` 1.564/1.833, 1.745/1.909, 1.935/1.925, 1.678/1.923× (lower quartiles 1.303/1.794,
    // 1.396/1.889, 1.662/1.901, 1.529/1.910), 2 MiB pages 1.866/1.910, 1.634/1.848, 1.703/1.904,
    // 1.592/1.913×; at 12:11:18 (this code) `Vec` 1.920/1.957, 1.704/1.872×, 2 MiB pages
    // 1.913/1.948, 1.718/1.847×; 2048³ level (`Vec` 1.931/1.898, 1.923/1.929, 1.954/1.945,
    // 1.931/1.955, 1.909/1.911, 1.939/1.884×; 2 MiB pages 1.922/1.904, 1.858/1.936×); conv-ops
    // 2-thread forward convgemm level (`probe_passes --back-to-back --threads 2`, medians of 20
    // calls, 12:11:18: 64@56² 4.050/4.074, 4.059/4.000 ms; 256@14² 3.757/3.817, 3.954/3.834 ms).
    let crew = (m.saturating_mul(n).saturating_mul(k) >= crew::MIN_MNK).then(|| Crew::new(tm * tn));
    (0..tm * tn).into_par_iter().for_each(|t| {
        let rows = part(m, K::MR, tm, t / tn);
        let single = [AtomicU64::new(0)];
        let cols = if shared {
            Columns {
                range: (0, n),
                threads: tn,
                own: t % tn,
                shares: &shares[t / tn * tn..][..tn],
            }
        } else {
            Columns {
                range: part(n, K::NR, tn, t % tn),
                threads: 1,
                own: 0,
                shares: &single,
            }
        };
        if rows.0 < rows.1 && cols.range.0 < cols.range.1 {
            let member = crew.as_ref().map(Crew::join);
            with_workspace(|ws| {
                serial(
                    kern,
                    bs,
                    exact,
                    rows,
                    cols,
                    k,
                    a,
                    b,
                    &sink,
                    ws,
                    member.as_ref(),
                )
            });
        } else if let Some(c) = &crew {
            c.skip();
        }
    });
}

/// The columns of one row range of C and how its threads share them. The range is cut into
/// `threads` contiguous shares as a static split would cut it (at NR multiples), each in `NC`-wide
/// column blocks (share 0's first one narrower when it is C's cache-line head); share `t` is
/// thread `t`'s: it runs its blocks from the front, and a thread whose share is empty takes
/// blocks from the back of another's. `shares[t]` counts the blocks taken from the front of
/// share `t` (low 32 bits) and from its back (high 32 bits); every block is taken exactly once.
struct Columns<'c> {
    /// `[start, end)` of the columns.
    range: (usize, usize),
    /// How many threads share them (block widths are capped so that each can get one).
    threads: usize,
    /// This thread's share.
    own: usize,
    /// The shares' states (`threads` of them).
    shares: &'c [AtomicU64],
}

/// Whether `k ≥ 1` rows of `n` values, row `p` at `p · ld`, lie inside storage of `len` values.
fn rows_inside(len: usize, ld: usize, k: usize, n: usize) -> bool {
    k.checked_sub(1)
        .and_then(|last| last.checked_mul(ld))
        .and_then(|start| start.checked_add(n))
        .is_some_and(|end| end <= len)
}

/// The five loops over the rows `rows` of C and the column blocks of `columns` this thread
/// takes, on the current thread.
#[allow(clippy::too_many_arguments)]
fn serial<K: Kernel, A: PackA, B: PackB, S: Store>(
    kern: K,
    bs: BlockSizes,
    exact: Exact,
    rows: (usize, usize),
    columns: Columns<'_>,
    k: usize,
    a: &A,
    b: &B,
    sink: &Sink<'_, S>,
    ws: &mut Workspace,
    member: Option<&Member<'_>>,
) {
    let (mr, nr) = (K::MR, K::NR);
    let cols = columns.range;
    // Several A blocks and several passes ([`Kernel::DEEPER_PASSES`]): passes 4/3 deeper (KC
    // rounded down to 16) and A blocks as much shorter (the same L2 budget MC·KC): a quarter
    // fewer C-tile loads and stores, B blocks (in L3) read in fewer, longer passes. Shapes with
    // one A block keep the table's sizes (64×50176×576 lost 4-5 points at KC 512 / MC 256).
    // Session 20, avx512, gemm_ratio 1 thread, `CORE_BLAS_KC=512 CORE_BLAS_MC=256` against the
    // table's 384 / 336, quiet 01:53 and 01:55 UTC: 2048³ 92.9/94.3, 92.3/95.7, 91.0/94.0,
    // 92.0/94.7, 91.8/93.7, 91.2/93.8%; 3136×256×2304 80.3/81.2, 79.2/81.9%; 1024³ 85.8/85.9,
    // 88.6/91.1%; this rule against the table, 2048³, quiet 02:00 and 02:01 (noisy host, peaks
    // 110-114): 88.8/89.8, 90.0/90.2, 88.6/89.1, 87.9/90.5, 89.2/89.7, 91.1/91.1, 88.5/90.5%.
    // Exact block sizes ([`Exact`]) run as given: none of this rule, the balancing below or the
    // B block's L2 width.
    let bs = if K::DEEPER_PASSES
        && !exact.kc
        && !exact.mc
        && rows.1 - rows.0 > bs.mc
        && k > bs.kc
        && tune::deep()
    {
        let kc = (bs.kc * 4 / 3 / 16 * 16).max(bs.kc);
        BlockSizes {
            kc,
            mc: (bs.mc * bs.kc / kc).div_ceil(mr).max(1) * mr,
            nc: bs.nc,
        }
    } else {
        bs
    };
    // Balance the blocks: k = 1000 with KC = 256 runs four passes of 250, not 256 + 256 + 256 +
    // 232 (a short last pass pays the C-tile traffic for little work); likewise for mc. A
    // product of two or three passes may run passes up to KC/8 deeper when that saves one (the
    // B micro-panel then fills 9/16 of L1 instead of 1/2): k = 576 runs 2 × 288 instead of
    // 3 × 192, k = 288 one pass instead of 2 × 144; each pass saved is one C-tile load and store
    // per tile, a third of them at k = 576. Session 9 (PERFORMANCE.md): 64×50176×576 in process
    // +1.3 to +2.2 points at 1 thread in five runs, +2.1 / +2.8 at 2 threads; old / new binaries
    // 2 threads 107-120 → 119-137 GFLOP/s in four pairs, 1 thread within the noise;
    // 128×12544×576 +1.3, 32×8192×288 +0.5, 64×8192×576 −0.2. Longer products keep KC: one pass
    // of nine saved was not a gain on 256×3136×2304 (sessions 7, 9).
    let kc = bs.kc.max(1);
    let kc_max = if exact.kc {
        kc.min(k.max(1))
    } else {
        bs.pass_depth(k)
    };
    // The depth the L2 budget of one A block is computed for (the slack's deeper passes keep
    // the B block's width, as a KC override to that depth would).
    let kc_budget = kc.max(kc_max);
    let m_len = rows.1 - rows.0;
    let mc_max = if exact.mc {
        bs.mc.div_ceil(mr).max(1) * mr
    } else {
        m_len
            .div_ceil(m_len.div_ceil(bs.mc.max(1)).max(1))
            .div_ceil(mr)
            .max(1)
            * mr
    };
    // A dense row-major B is packed inside the first tile of each panel (or group of `PACK_GROUP` panels): only
    // when the storage it hands over holds all k rows of n values (`PackB` is a safe trait, so a
    // source that hands over less is packed by `pack_b`), and never for k = 0.
    // (Groups are whole panels: `full` below and `macro_kernel` divide by the group.)
    const {
        assert!(
            K::PACK_GROUP >= 1,
            "a packing group holds at least one panel"
        );
        assert!(
            K::PACK_PANELS == 1 || K::PACK_PANELS == K::PACK_GROUP,
            "the first tile of each panel or of each group packs"
        )
    };
    let fuse = b.row_major().filter(|&(data, ld)| {
        K::PACKS_B && tune::fuse() && rows_inside(data.len(), ld, k, b.cols())
    });
    // The tiles of each panel copy the next panel's source rows (`Kernel::run_copying`: one
    // row every few rounds of their k-loops, each tile its share of the rows, after an L1
    // prefetch a few rows ahead) into the other slot of a two-panel ring, instead of the next
    // panel's first tile packing all of them at once: the source's reads spread over all the
    // tiles' FMAs. One pass over k, one A block of enough tiles, the dense store, Intel, and
    // source rows a multiple of 4 KiB apart (where the panel-ahead prefetch below is dropped;
    // at other strides that prefetch did better: 64×50192×576 in process 1.16 without copies,
    // 1.01 with them, against 50176 without). Session 42 (PERFORMANCE.md), Emerald Rapids,
    // 64×50176×576: `case_ab` in process, copies (L1 2 rows ahead, L2 16) / none, quiet
    // 21:27:18 and 21:36:44 UTC: `Vec` 1.000, 1.030, 1.015, 1.003; 2 MiB pages 1.110, 1.178;
    // `gemm_ratio 64 50176 576 1 9` main / this, ABBA twice, quiet 21:48:44: `Vec` 59.6/68.9,
    // 59.4/53.7, 60.6/68.1, 55.9/68.3%; 2 MiB pages 57.6/74.9, 55.8/76.2, 65.8/73.6, 55.0/66.4%.
    let copy_ahead = tune::copy_ahead().filter(|_| {
        K::COPIES_AHEAD
            && K::PACK_GROUP == 1
            && crate::isa::intel()
            && k <= kc_max
            && fuse.is_some_and(|(_, ld)| ld.is_multiple_of(1024))
            && m_len <= mc_max
            && m_len.div_ceil(mr) >= COPY_MIN_TILES
            && sink.direct.is_some()
            && tune::ring()
    });
    let mut nc_max = bs.nc.div_ceil(nr) * nr;
    if m_len <= mc_max && !exact.nc {
        // One A block only: the B block is not reused across ic, so keep it in L2 (the budget
        // MC·KC of the A block, which is mostly free here) instead of L3. Packing then writes to
        // L2 and the micro-kernels read it from L2.
        let l2_cols = (bs.mc * kc_budget / kc_max / nr).max(1) * nr;
        // Except when the block's panels are packed by their first tiles one over the other
        // (fused packing into a one-panel ring, `macro_kernel`: a kernel whose groups are one
        // panel): then the B block takes one panel of L2 whatever its width, and with several
        // passes over k a wide block keeps each pass's A block (`m × kc`) in L2 for the whole
        // pass, where L2-wide blocks re-read it from L3 once per block (the whole of A, packed
        // once for all of k, exceeds L2 on 256×3136×2304: 2.4 MB). Single-pass products keep
        // the L2 width (nothing to reuse across blocks).
        let ring_only = fuse.is_some() && K::PACK_GROUP == 1 && tune::ring() && k > kc_max;
        // Copies ahead take three panels of L2 (the ring's two slots and a partial last
        // panel) whatever the block's width: the blocks keep the table's NC, so that few
        // panels (each block's first) are packed by their first tiles.
        if !ring_only && copy_ahead.is_none() {
            nc_max = nc_max.min(l2_cols);
        }
        // With fused packing in groups of several panels (AVX2: 3), blocks of whole groups: a
        // block's full panels past its last whole group are packed up front by `pack_b` (a
        // copy pass with no FMAs to hide it, from rows prefetched in a burst of their own on
        // the panel before the last), which the AVX2 family's 496-wide blocks paid once a block
        // (31 panels, 10 groups). Session 38 (Zen 5), `CORE_BLAS_ISA=avx2 gemm_ratio 64 50176
        // 576 1 11`, main / 480-wide blocks (with the one-panel ring below), alternating in
        // both orders, quiet 08:45:31 and 08:49:45 UTC: `Vec` 87.0/89.7, 87.5/89.3, 85.4/88.0,
        // 86.7/90.1, 86.6/89.6, 86.7/89.1, 86.0/89.3, 87.5/89.8%; 2 MiB pages 88.8/90.6,
        // 88.3/89.5, 86.0/89.7, 88.9/89.7, 88.5/89.8, 88.1/89.8, 87.1/89.5, 88.4/89.8%
        // (528-wide blocks, rounded up, level with 480); 256×3136×2304 level.
        let gw = K::PACK_GROUP * nr;
        if fuse.is_some() && K::PACK_GROUP > 1 && nc_max >= gw {
            nc_max = nc_max / gw * gw;
        }
    }
    // A product that writes C once (one pass over k, beta = 0, no epilogue) into a dense C
    // larger than L2 streams its full AVX-512 tiles to C with non-temporal stores on Intel: no
    // line of C is read for ownership (12.8 MB of 64×50176×576's memory traffic besides B's
    // 115.6 MB) and the tiles issue no C prefetch, whose misses held fill buffers the B
    // source's prefetches need. C then leaves the product in memory, not in cache: a C of
    // this size would not stay in L2 anyway. Session 41 (PERFORMANCE.md), Emerald Rapids,
    // `case_ab 64 50176 576` in process, main / streamed interleaved per repetition.
    let stream = K::STREAMS_C
        && tune::STREAM_PROBE.load(Ordering::Relaxed) == 0
        && crate::isa::intel()
        && k > 0
        && k <= kc_max
        && sink
            .direct
            .is_some_and(|d| d.beta == 0.0 && d.cs == 1 && !d.has_epilogue())
        && (rows.1 - rows.0) * (cols.1 - cols.0) * 4 > crate::CacheSizes::detect().l2;
    // The fused packing's prefetch one panel ahead, dropped on Intel for a one-pass product
    // whose source rows lie a multiple of 4 KiB apart (64×50176×576: 196 KiB): every row of a
    // panel then maps to the same few L1 sets and 1/32 of the L2 sets (18 rows of a 576-deep
    // panel to each set of a 16-way L2 with 2 MiB pages, as many on average with 4 KiB
    // pages), so the next panel's rows do not last in L2 until its first tile reads them, and
    // their misses only hold fill buffers; the packing tile's own L1 prefetch (16 rows ahead)
    // fetches the source. Rows off 4 KiB keep it (64×50192×576: dropping it lost ~8%), as do
    // products of several passes (not measured here). Session 41 (PERFORMANCE.md), Emerald
    // Rapids, `case_ab 64 50176 576` in process, interleaved per repetition.
    let panel_ahead = !(crate::isa::intel()
        && k <= kc_max
        && fuse.is_some_and(|(_, ld)| ld.is_multiple_of(1024)));
    let panel_ahead = panel_ahead && copy_ahead.is_none();
    // When B is packed up front, the next B block is prefetched (`PackB::prefetch_b`) only when
    // a block fits the L2 budget of the A block (the case just above): a larger one would evict
    // the A block from L2. (Fused packing prefetches one panel or group ahead instead, for every block.)
    // Session 18, Zen 4 (L2 1 MiB), gemm_ratio 1 thread, quiet 19:07 UTC, HEAD / every block /
    // only L2-sized blocks: 2048³ (4080-wide blocks) 93.2 / 92.4 / 92.6, 93.8 / 92.0 / 92.7% of
    // the peak; 64×50176×576 (432-wide) 73.5 / 79.6 / 78.8, 73.2 / 78.5 / 79.7%.
    let prefetch_next = nc_max * kc_max <= bs.mc * kc_budget;
    // The widest block: NC, or a thread's part of the columns when narrower.
    let nc_blk = nc_max.min(
        (cols.1 - cols.0)
            .div_ceil(columns.threads.max(1))
            .div_ceil(nr)
            .max(1)
            * nr,
    );
    let b_len = nc_blk.min((cols.1 - cols.0).div_ceil(nr) * nr) * kc_max;
    // With copies ahead the B buffer holds the ring's two slots and the partial last panel.
    let b_len = if copy_ahead.is_some() {
        b_len.min(3 * nr * kc_max)
    } else {
        b_len
    };
    // One A block and several B blocks: pack A once for all of k and reuse it for every jc
    // (instead of re-packing the same block per jc), unless the source hands over its own panels.
    let m_pad = m_len.div_ceil(mr) * mr;
    let a_once = m_len <= mc_max
        && cols.1 - cols.0 > nc_max
        && tune::a_once()
        && a.packed_a(rows.0, m_len, 0, kc_max.min(k), mr).is_none();
    let a_len = if a_once {
        m_pad * k
    } else {
        mc_max.min(m_pad) * kc_max
    };
    // An im2col-like B ([`PackB::conv_panel`]) on a kernel that packs it in its k-loop: the
    // first tile of each full panel packs it (a panel the source does not describe is packed
    // by `pack_b` just before its tiles); only the partial last panel is packed up front.
    let conv = fuse.is_none()
        && K::PACKS_CONV
        && K::PACK_GROUP == 1
        && nr.is_multiple_of(crate::CHUNK_LANES)
        && (sink.direct.is_some() || sink.store.windows_everywhere())
        && tune::fuse()
        && b.conv_fusable(nr);
    // The resolved panels of earlier products on this thread (put back at the end).
    let mut conv_bufs = ConvBufs {
        panel: ConvPanel::default(),
        rows: std::mem::take(&mut ws.conv),
    };
    let ac = ws.a.get(a_len);

    // A single A block packed once over a row-major B and a dense C whose rows start off a
    // 64-byte boundary (a `Vec` from malloc starts 16 bytes past one) at the same offset as B's:
    // the columns before C's first boundary run as a narrow first block (edge tiles, packed by
    // `pack_b`), so every later panel's C rows and B source rows start on a cache line (one
    // line less per 16 columns of a row for the AVX2 family's 6×16 tile, whose 64-byte C rows
    // would otherwise each span two lines). A is packed once, so the narrow block costs no A
    // packing. Session 23, gemm_ratio 1 thread, `Vec` operands, base / this, quiet 10:06 UTC:
    // `CORE_BLAS_ISA=avx2` 64×50176×576 79.0/82.7, 76.9/81.1, 77.2/81.7%, 256×3136×2304
    // 89.4/89.9, 86.6/87.0, 85.7/86.6%; avx512 level (256×3136×2304 93.0/93.2, 89.6/88.5,
    // 90.1/90.1%; 64×50176×576 85.1/85.2, 83.0/82.6, 82.3/83.8%).
    let head = match (sink.direct, fuse) {
        (Some(d), Some((data, ld))) if d.cs == 1 && d.rs.is_multiple_of(16) => {
            let c_off = d.ptr.wrapping_add(rows.0 * d.rs + cols.0) as usize % 64;
            let b_off = data.as_ptr().wrapping_add(cols.0) as usize % 64;
            let h = (64 - c_off) % 64 / 4;
            // Row strides as multiples of 16 floats (64 bytes): `ld` may be any size (`usize::MAX`
            // when k = 1), so never scaled to bytes.
            let aligned_b = ld.is_multiple_of(16) && b_off == c_off;
            if aligned_b && h < cols.1 - cols.0 {
                h
            } else {
                0
            }
        }
        _ => 0,
    };
    // Several A blocks (A packed per block, so a narrow first block would pack all of A once
    // more): families whose tile rows are one line (NR = 16, AVX2) run the head columns beside
    // the first real block instead, as one narrow panel packed per pass into `hb` (after the B
    // block in the same buffer), its tiles on each packed A block of that block. Session 24,
    // `CORE_BLAS_ISA=avx2 gemm_ratio 2048 2048 2048 1 5`, `Vec` operands, base / this, quiet
    // 13:45 and 13:49 UTC: 88.0/89.0, 87.8/89.3, 90.3/91.8; 89.3/90.3, 90.4/92.6, 90.2/87.9,
    // 90.5/91.0, 90.1/91.7, 90.0/91.2% (8 of 9 pairs up, median +1.2). AVX-512 (48-wide rows,
    // three lines or four) level at 1 thread (93.7/93.7, 94.3/94.7, 94.8/94.3%), so not there.
    let (head, side) = match (a_once, nr * 4 == 64) {
        (true, _) => (head, 0),
        (false, true) => (0, head),
        (false, false) => (0, 0),
    };
    let bc = if side > 0 {
        ws.b.get(b_len + nr * kc_max)
    } else {
        ws.b.get(b_len)
    };
    let (bc, hb) = bc.split_at_mut(b_len);
    let start = cols.0 + side;
    let threads = columns.threads.max(1);
    let body = start + head;
    let len = cols.1.saturating_sub(body);
    // Share t: the columns of part t of a static split of the body (cut at NR multiples, as
    // `part` splits rows), in NC-wide blocks from its start; share 0 begins with the head.
    let share = |t: usize| part(len, nr, threads, t);
    let blocks = |t: usize| {
        let (lo, hi) = share(t);
        (hi - lo).div_ceil(nc_max) + usize::from(t == 0 && head > 0)
    };
    // Block `j` of share `t`.
    let block = |t: usize, j: usize| -> Option<(usize, usize)> {
        let j = match (t, head, j) {
            (0, h, 0) if h > 0 => return Some((start, h)),
            (0, h, j) if h > 0 => j - 1,
            (_, _, j) => j,
        };
        let (lo, hi) = share(t);
        let at = lo + j * nc_max;
        (at < hi).then(|| (body + at, nc_max.min(hi - at)))
    };
    // Take a block of share `t`, from its front or its back, if it has any left. Relaxed
    // suffices: the state only hands out indices (each to one thread); the blocks' C windows
    // are disjoint and rayon's join orders all of them before the product returns.
    let take = |t: usize, back: bool| -> Option<(usize, usize)> {
        let count = blocks(t) as u64;
        debug_assert!(count < 1 << 32, "block counts fit a share state's halves");
        let state = columns.shares[t]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| {
                let taken = (x & 0xffff_ffff) + (x >> 32);
                (taken < count).then_some(x + if back { 1 << 32 } else { 1 })
            })
            .ok()?;
        block(
            t,
            if back {
                (count - 1 - (state >> 32)) as usize
            } else {
                (state & 0xffff_ffff) as usize
            },
        )
    };
    let own = || take(columns.own, false);
    let other = || (1..threads).find_map(|d| take((columns.own + d) % threads, true));
    let mut current = own().or_else(other);
    // Whether this thread has packed its single A block for all of k (`a_once`): in its first
    // block's passes, whichever block that is.
    let mut a_packed = false;
    while let Some((jc, nc)) = current {
        let with_side = side > 0 && jc == start;
        // The next block of this thread's share, taken when the last A block of this block's
        // last pass starts so that its tiles can prefetch it (blocks of other shares are taken
        // only once this one is done: a thread never holds another's block ahead).
        let mut upcoming = None;
        let mut pc = 0;
        loop {
            let kc = kc_max.min(k - pc);
            let (first, last) = (pc == 0, pc + kc >= k);
            // A block the source holds packed ([`PackB::packed_b`]) is read in place.
            let handed = if fuse.is_none() && !conv {
                b_block(b, pc, kc, jc, nc, nr)
            } else {
                None
            };
            if fuse.is_some() || conv {
                // Whole groups of full panels are packed by their first tiles (groups of one
                // panel for an im2col-like B: `conv` implies `PACK_GROUP == 1`); pack_b does the
                // rest (the partial last panel, full panels past the last whole group).
                let full = nc / (nr * K::PACK_GROUP) * (nr * K::PACK_GROUP);
                if full < nc {
                    let at = partial_slot(copy_ahead.is_some(), full, nr);
                    b.pack_b(pc, kc, jc + full, nc - full, nr, &mut bc[at * kc..]);
                }
            } else if handed.is_none() {
                b.pack_b(pc, kc, jc, nc, nr, bc);
            }
            if with_side {
                b.pack_b(pc, kc, cols.0, side, nr, &mut hb[..nr * kc]);
            }
            // The B block packed after this one: its reads are spread over the last ic block.
            let next_pass = (!last).then(|| (pc + kc, kc_max.min(k - pc - kc), jc, nc));
            let mut ic = rows.0;
            while ic < rows.1 {
                let mc = mc_max.min(rows.1 - ic);
                // The B block after this one (its reads spread over the last A block's tiles).
                let next = if ic + mc < rows.1 {
                    None
                } else if last {
                    upcoming = own();
                    upcoming.map(|(j, w)| (0, kc_max.min(k), j, w))
                } else {
                    next_pass
                };
                let (ablk, a_stride) = if a_once {
                    // Block pc of the k-long packing (the blocks before it are kc_max deep).
                    let blk = &mut ac[pc * m_pad..][..m_pad * kc];
                    if !a_packed {
                        a.pack_a(ic, mc, pc, kc, mr, blk);
                    }
                    (&*blk, kc * mr)
                } else {
                    a_block(a, ic, mc, pc, kc, mr, ac)
                };
                if with_side && let Some(d) = sink.direct {
                    let beta = if first { d.beta } else { 1.0 };
                    let mut ir = 0;
                    while ir < mc {
                        let m = mr.min(mc - ir);
                        let ap = ablk[ir / mr * a_stride..].as_ptr();
                        // SAFETY: `ap` starts a packed A micro-panel of `kc · MR` values (the
                        // block's), `hb` holds the head's packed panel (`kc · NR` values, zero
                        // past `side` columns); the `m × side` window at (ic + ir, cols.0) lies
                        // inside C and belongs to block 0, which this thread took (side <
                        // cols.1 − cols.0).
                        unsafe {
                            let cp = d.ptr.add((ic + ir) * d.rs + cols.0 * d.cs);
                            kern.run(kc, d.alpha, ap, hb.as_ptr(), beta, cp, d.rs, d.cs, m, side);
                            if last && d.has_epilogue() {
                                d.epilogue(ic + ir, cols.0, m, side);
                            }
                        }
                        ir += mr;
                    }
                }
                let prefetch = if fuse.is_some() {
                    // Fused packing reads each panel's source in its first tile: prefetch one
                    // panel ahead (the next of this block in the first A block, the next
                    // block's first from the last), not a whole block.
                    let ahead = Ahead {
                        pc,
                        within: ic == rows.0,
                        next,
                    };
                    (tune::prefetch_enabled() && panel_ahead).then_some(Prefetch::Panels(b, ahead))
                } else if ic + mc >= rows.1 && prefetch_next && tune::prefetch_enabled() {
                    next.map(|n| Prefetch::Block(b, n))
                } else {
                    None
                };
                // The first A block's tiles pack the B panels (fused), the others read them.
                let src = fuse
                    .filter(|_| ic == rows.0)
                    .map(|(data, ld)| (&data[pc * ld + jc..], ld));
                let conv_src = (conv && ic == rows.0).then_some((b, pc, &mut conv_bufs));
                macro_kernel(
                    kern,
                    (ic, jc),
                    (mc, nc, kc),
                    (ablk, a_stride),
                    &mut *bc,
                    handed,
                    src,
                    m_len <= mc_max && tune::ring(),
                    copy_ahead,
                    conv_src,
                    first,
                    last,
                    sink,
                    prefetch,
                    stream,
                    member,
                );
                ic += mc;
            }
            pc += kc;
            if pc >= k {
                break;
            }
        }
        a_packed = true;
        current = upcoming.or_else(other);
    }
    ws.conv = conv_bufs.rows;
    #[cfg(target_arch = "x86_64")]
    if stream {
        // Non-temporal stores are weakly ordered: fence them before the product returns (or
        // this part of it signals its end to the others).
        // SAFETY: `sfence` touches no memory operand; SSE is in the x86_64 baseline.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
}

/// Where in the B buffer the columns past a block's last whole group (`full` of them before)
/// are packed: right after those groups, or with copies ahead (`serial`'s `copy_ahead`: a
/// two-panel ring) after the ring's slots.
#[inline]
fn partial_slot(copy_ahead: bool, full: usize, nr: usize) -> usize {
    if copy_ahead { full.min(2 * nr) } else { full }
}

/// Scratch of the fused im2col packing: the source's panel description and its rows
/// resolved and checked ([`ConvRows::resolve`]).
#[derive(Default)]
struct ConvBufs {
    panel: ConvPanel,
    rows: ConvRows,
}

/// Switches for the tuning probes (`kernel/probe.rs`); fixed in normal builds.
pub(crate) mod tune {
    /// 0: normal; 1: no prefetch of the next B block; 2: that prefetch in one burst per jr step;
    /// 3: a single A block re-packed per jc block; 4: a row-major B packed up front, not in the
    /// first tiles; 5: the table's block sizes also with several A blocks; 6: one A block's
    /// packing groups each at its place in the B buffer; 7: no copies ahead (each panel packed
    /// by its first tile).
    #[cfg(test)]
    pub(crate) static MODE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// Runs `f` with the driver in mode `mode`, then back in mode 0 (also when `f` panics).
    /// Tests run in parallel threads: the callers hold one lock, so one test's mode never
    /// switches another's mid-comparison (a test that sets no mode may still run under one;
    /// every mode computes the same products).
    #[cfg(test)]
    pub(crate) fn with_mode<R>(mode: usize, f: impl FnOnce() -> R) -> R {
        use std::sync::atomic::Ordering;
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                MODE.store(0, Ordering::Relaxed);
            }
        }
        let _lock = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let _reset = Reset;
        MODE.store(mode, Ordering::Relaxed);
        f()
    }

    /// Whether the next B block is prefetched.
    #[inline]
    pub(crate) fn prefetch_enabled() -> bool {
        #[cfg(test)]
        if MODE.load(std::sync::atomic::Ordering::Relaxed) == 1 {
            return false;
        }
        true
    }

    /// Whether a single A block is packed once for all jc blocks (mode 3: per jc, as before).
    #[inline]
    pub(crate) fn a_once() -> bool {
        #[cfg(test)]
        if MODE.load(std::sync::atomic::Ordering::Relaxed) == 3 {
            return false;
        }
        true
    }

    /// Whether a row-major B is packed inside the first tiles of its panels (mode 4: packed
    /// up front by `pack_b`, as before).
    #[inline]
    pub(crate) fn fuse() -> bool {
        #[cfg(test)]
        if MODE.load(std::sync::atomic::Ordering::Relaxed) == 4 {
            return false;
        }
        true
    }

    /// Whether products with several A blocks run deeper passes (mode 5: the table's sizes).
    #[inline]
    pub(crate) fn deep() -> bool {
        #[cfg(test)]
        if MODE.load(std::sync::atomic::Ordering::Relaxed) == 5 {
            return false;
        }
        true
    }

    /// Whether one A block's packing groups are packed over one another at the front of the
    /// B buffer (mode 6: each at its place in the block, as before).
    #[inline]
    pub(crate) fn ring() -> bool {
        #[cfg(test)]
        if MODE.load(std::sync::atomic::Ordering::Relaxed) == 6 {
            return false;
        }
        true
    }

    /// How many rows ahead the copying tiles prefetch into L1 and toward L2, or `None`: no
    /// copies ahead (probe switch [`COPY_PROBE`]: 0 the default, 1 none, `2 + near + 256 · far`).
    #[inline]
    pub(crate) fn copy_ahead() -> Option<(usize, usize)> {
        #[cfg(test)]
        if MODE.load(std::sync::atomic::Ordering::Relaxed) == 7 {
            return None;
        }
        match COPY_PROBE.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Some((super::COPY_AHEAD_ROWS, super::COPY_FAR_ROWS)),
            1 => None,
            d => Some(((d - 2) % 256, (d - 2) / 256)),
        }
    }

    /// Probes only (`crate::__set_stream_probe`): 1 never streams C.
    pub(crate) static STREAM_PROBE: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    /// Probes only (`crate::__set_copy_probe`): see [`copy_ahead`].
    pub(crate) static COPY_PROBE: std::sync::atomic::AtomicUsize =
        std::sync::atomic::AtomicUsize::new(0);

    /// Whether a jr step's prefetch is spread over its tiles.
    #[inline]
    pub(crate) fn spread() -> bool {
        #[cfg(test)]
        if MODE.load(std::sync::atomic::Ordering::Relaxed) == 2 {
            return false;
        }
        true
    }
}

/// The packed A block at `(ic, pc)` and its micro-panel stride: the source's own panels when it
/// offers them ([`PackA::packed_a`]) and they are long enough, else packed into `ac`.
#[inline]
fn a_block<'s, A: PackA>(
    a: &'s A,
    ic: usize,
    mc: usize,
    pc: usize,
    kc: usize,
    mr: usize,
    ac: &'s mut [f32],
) -> (&'s [f32], usize) {
    let panels = mc.div_ceil(mr);
    if let Some((data, stride)) = a.packed_a(ic, mc, pc, kc, mr) {
        let need = (panels - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(kc * mr));
        if stride >= 1 && need.is_some_and(|need| data.len() >= need) {
            return (data, stride);
        }
    }
    a.pack_a(ic, mc, pc, kc, mr, ac);
    (ac, kc * mr)
}

/// The B block at `(pc, jc)` as the source's own panels and their stride
/// ([`PackB::packed_b`]), when it offers them and they are long enough.
#[inline]
fn b_block<B: PackB>(
    b: &B,
    pc: usize,
    kc: usize,
    jc: usize,
    nc: usize,
    nr: usize,
) -> Option<(&[f32], usize)> {
    let (data, stride) = b.packed_b(pc, kc, jc, nc, nr)?;
    let need = (nc.div_ceil(nr) - 1)
        .checked_mul(stride)
        .and_then(|x| x.checked_add(kc * nr));
    (stride >= 1 && need.is_some_and(|need| data.len() >= need)).then_some((data, stride))
}

/// Loops jr and ir over the packed blocks `ac` (`mc × kc`) and `bc` (`kc × nc`; or the
/// source's own panels `packed`, [`PackB::packed_b`]) for the block of C at `(ic, jc)`.
#[allow(clippy::too_many_arguments)]
#[inline]
fn macro_kernel<K: Kernel, S: Store, B: PackB>(
    kern: K,
    (ic, jc): (usize, usize),
    (mc, nc, kc): (usize, usize, usize),
    (ac, a_stride): (&[f32], usize),
    bc: &mut [f32],
    packed: Option<(&[f32], usize)>,
    src: Option<(&[f32], usize)>,
    ring: bool,
    copy_ahead: Option<(usize, usize)>,
    mut conv: Option<(&B, usize, &mut ConvBufs)>,
    first: bool,
    last: bool,
    sink: &Sink<'_, S>,
    prefetch: Option<Prefetch<'_, B>>,
    stream: bool,
    member: Option<&Member<'_>>,
) {
    // Slices of the next B block to prefetch, one per jr iteration.
    let steps = nc.div_ceil(K::NR);
    let slice = match prefetch {
        Some(Prefetch::Block(_, (_, _, _, nc2))) => nc2.div_ceil(steps).div_ceil(16) * 16,
        _ => 0,
    };
    let (mr, nr) = (K::MR, K::NR);
    debug_assert!(ac.len() >= (mc.div_ceil(mr) - 1) * a_stride + mr * kc);
    // bc holds every panel of the block, or with copies ahead (`serial`'s `copy_ahead`) the
    // ring's two slots and the partial last panel: every panel's slot (`slot` below) lies
    // inside the first `b_panels`.
    let b_panels = if copy_ahead.is_some() {
        nc.div_ceil(nr).min(3)
    } else {
        nc.div_ceil(nr)
    };
    debug_assert!(bc.len() >= b_panels * nr * kc);
    // The tile buffer exists only for custom stores (the dense store writes from registers).
    let mut tile_buf: Option<[f32; MAX_TILE]> = None;
    debug_assert!(mr * nr <= MAX_TILE);
    let bc_ptr = bc.as_mut_ptr();
    // Panels packed by first tiles come in groups of `g` (the columns past the last whole group
    // were packed by `pack_b`).
    let (g, gw) = (K::PACK_GROUP, K::PACK_GROUP * K::NR);
    let grouped = nc / gw * gw;
    let mut jr = 0;
    while jr < nc {
        if let Some(m) = member {
            m.checkpoint();
        }
        let n = nr.min(nc - jr);
        // With one A block, the groups the first tiles pack (from `src`) are read only by this
        // jr step's tiles: each is packed over the last one, at the front of bc, so the packed
        // block (496 × 288 floats, 571 KB, for 64×50176×576 on AVX2) does not sweep L2 and
        // evict the source rows prefetched for the next group (the columns past the last whole
        // group stay where `serial` packed them, past the first group). gemm_ratio 1 thread,
        // main / this, quiet 15:53:58 UTC: `CORE_BLAS_ISA=avx2` 64×50176×576 `Vec` 84.5/84.9,
        // 82.5/84.9, 78.7/84.6, 84.4/84.9%, 2 MiB pages 85.3/86.8, 84.7/84.7, 85.3/86.0,
        // 85.4/86.6% (in process 84.7/86.2, 84.8/86.3%); 15:55:13: 256×3136×2304 avx2 `Vec`
        // 89.6/88.5, 87.0/89.5%, 2 MiB pages 76.8/79.8, 91.4/92.8%, avx512 `Vec` 92.3/92.6,
        // 93.0/94.1%, 2 MiB pages 96.3/96.3, 95.8/96.2%.
        // A kernel whose first tiles pack one panel each (`PACK_PANELS == 1`, AVX2) packs each
        // panel over the last one, whose lines its tiles have just read from L1, so the
        // packing stores hit L1 instead of filling lines of a 3-panel ring from L2. Session 38
        // (Zen 5), `CORE_BLAS_ISA=avx2 gemm_ratio 64 50176 576 1 11`, 3-panel / one-panel
        // ring, alternating in both orders, quiet 08:26:03, 08:36:53 and 08:42:49 UTC: `Vec`
        // 9 of 12 pairs up (e.g. 87.4/87.6, 86.1/86.7, 85.3/86.1%), 2 MiB pages 8 of 12 up,
        // 1 level (e.g. 88.3/88.8, 87.5/88.3, 88.0/88.7%): median +0.3-0.4 points.
        // With copies ahead (`serial`'s `copy_ahead`), panels alternate between two slots: the
        // tiles of one panel copy the next panel into the other.
        let copy = copy_ahead.filter(|_| ring && src.is_some());
        let slot = |j: usize| {
            if ring && src.is_some() && j < grouped {
                if copy.is_some() {
                    (j / nr % 2) * nr
                } else {
                    j % (K::PACK_PANELS * nr)
                }
            } else if j >= grouped {
                partial_slot(copy_ahead.is_some(), j, nr)
            } else {
                j
            }
        };
        let at = slot(jr);
        // SAFETY: `slot` puts every panel inside the first `b_panels` panels of bc (at <= jr,
        // and with copies ahead at <= 2 · nr), which bc holds (asserted above).
        let bdst = unsafe { bc_ptr.add(at * kc) };
        // The source's own panels are read in place (then nothing is packed into bc: `serial`
        // hands them over only without fused packing, so `src` and `conv` are None).
        let bp = match packed {
            Some((data, stride)) => data[jr / nr * stride..].as_ptr(),
            None => bdst.cast_const(),
        };
        // The rows this tile packs from a row-major source when it is the first tile of a
        // group (`PACK_PANELS == PACK_GROUP`) or of any full panel of a group
        // (`PACK_PANELS == 1`): row p at src[p · ld + jr ..][.. pw] (whole panels inside the
        // matrix, whose rows `serial` checked to lie inside the source's storage).
        let pw = K::PACK_PANELS * nr;
        let mut pending = src
            .filter(|_| jr < grouped && (jr / nr).is_multiple_of(K::PACK_PANELS))
            .filter(|_| copy.is_none() || jr == 0)
            .map(|(data, ld)| {
                debug_assert!(data.len() >= (kc - 1) * ld + jr + pw);
                (data[jr..].as_ptr(), ld)
            });
        if sink.direct.is_none()
            && let Some((sp, ld)) = pending.take()
        {
            // Stores that are not the dense one: pack the panels before their tiles.
            for q in 0..K::PACK_PANELS {
                for p in 0..kc {
                    // SAFETY: row p holds pw source values (the debug_assert above: the
                    // panels lie inside the source) and their packed panels
                    // PACK_PANELS · kc · nr values of bc, which the source (a shared borrow)
                    // does not overlap.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            sp.add(p * ld + q * nr),
                            bdst.add((q * kc + p) * nr),
                            nr,
                        )
                    };
                }
            }
        }
        // A full panel of an im2col-like B (first A block): described for the first tile's
        // fused packing, or packed here when the source or the store does not allow it.
        let mut conv_rows: Option<(*const f32, &ConvRows)> = None;
        if let Some((b, pc, bufs)) = conv.as_mut()
            && jr + nr <= nc
        {
            // SAFETY: the full panel at jr: `nr · kc` values of bc from `bdst` (its slot lies
            // inside bc, asserted above); no other reference to them is live.
            let panel = unsafe { std::slice::from_raw_parts_mut(bdst, nr * kc) };
            let ConvBufs { panel: desc, rows } = &mut **bufs;
            if (sink.direct.is_some() || sink.store.windows_everywhere())
                && let Some(data) = b.conv_panel(*pc, kc, jc + jr, nr, desc)
                && rows.resolve(desc, data.len(), kc, nr / crate::CHUNK_LANES)
            {
                conv_rows = Some((data.as_ptr(), &*rows));
            } else {
                b.pack_b(*pc, kc, jc + jr, nr, nr, panel);
            }
        }
        // This jr step's slice of the next B block: its rows spread over the step's tiles.
        let tiles = mc.div_ceil(mr);
        let spread = tune::spread();
        let pf = match prefetch {
            Some(Prefetch::Block(b, (pc2, kc2, jc2, nc2))) => {
                let lo = (jr / nr * slice).min(nc2);
                let hi = (lo + slice).min(nc2);
                (lo < hi).then_some((b, pc2, kc2, jc2 + lo, hi - lo))
            }
            Some(Prefetch::Panels(b, ah)) => {
                if jr + nr < nc {
                    // The next group of this block, when a first tile will pack it: its rows
                    // split over the panels of this group (part `q` in the group's panel `q`).
                    let q = (jr / nr) % g;
                    let jn = jr - q * nr + gw;
                    let (r0, r1) = (kc * q / g, kc * (q + 1) / g);
                    let group = (ah.within && jn < grouped && r0 < r1).then_some((
                        b,
                        ah.pc + r0,
                        r1 - r0,
                        jc + jn,
                        gw,
                    ));
                    // Else, on the panel before the last: the next block's columns past its
                    // last whole group, which `serial` packs up front (`pack_b`) from a source
                    // nothing prefetched (the AVX2 family's 31st panel of its 496-wide blocks).
                    // Session 21, `CORE_BLAS_ISA=avx2 gemm_ratio`, 1 thread, without / with:
                    // 64×50176×576 79.7/81.2, 80.2/81.2, 79.4/81.0, 79.6/80.9, 80.0/80.5%
                    // (quiet 04:10 UTC), 80.4/81.5, 79.8/81.6, 79.1/80.4, 79.8/81.2% (04:14);
                    // 256×3136×2304 level (87.3/88.1, 88.4/89.0, 87.9/88.0, 87.3/87.9,
                    // 87.4/86.6%; 87.9/87.4, 87.9/86.6, 86.5/85.6%); avx512 2048³ (a 32-wide
                    // last panel) level (94.4/94.0, 94.1/94.4, 93.7/95.4, 94.2/93.9, 94.2/92.8%;
                    // 94.9/95.4, 93.6/93.7, 93.7/93.5, 93.8/94.2%).
                    let rest = || {
                        ah.next
                            .filter(|&(_, _, _, nc2)| jr + 2 * nr >= nc && nc2 % gw != 0)
                            .map(|(pc2, kc2, jc2, nc2)| {
                                let full = nc2 / gw * gw;
                                (b, pc2, kc2, jc2 + full, nc2 - full)
                            })
                    };
                    group.or_else(rest)
                } else {
                    ah.next
                        .map(|(pc2, kc2, jc2, nc2)| (b, pc2, kc2, jc2, gw.min(nc2)))
                }
            }
            None => None,
        };
        // Between `conv_panel` above and the first tile below, only `prefetch_b` may be called
        // on the source (the contract of `PackB::conv_panel`'s slice).
        if let Some((b, pc2, kc2, j2, w2)) = pf
            && !spread
        {
            b.prefetch_b(pc2, kc2, j2, w2);
        }
        // A row-major source the panels' prefetch reads (fused packing), for the kernels.
        let rm = match prefetch {
            Some(Prefetch::Panels(b, _)) if sink.direct.is_some() => b.row_major(),
            _ => None,
        };
        // The next panel, when this panel's tiles copy it (every full panel after the first
        // is copied by the tiles of the one before): tile t's share of its rows, the packing
        // first tile left out.
        let copy_next = copy.filter(|_| jr + nr < grouped).and_then(|ahead| {
            let (data, ld) = src?;
            let jn = jr + nr;
            Some((data[jn..].as_ptr(), ld, slot(jn), ahead.0, ahead.1))
        });
        let copiers0 = usize::from(pending.is_some());
        let copiers = tiles.saturating_sub(copiers0).max(1);
        let mut ir = 0;
        while ir < mc {
            // This tile's share of the copy (`copy_next`).
            let row_copy = copy_next.and_then(|(sp, ld, at2, ahead, far)| {
                let t = (ir / mr).checked_sub(copiers0)?;
                let (r0, r1) = (kc * t / copiers, kc * (t + 1) / copiers);
                (r0 < r1).then(|| RowCopy {
                    src: sp.wrapping_add(r0 * ld),
                    ld,
                    // SAFETY: at2 is the next panel's slot (nr or 0: inside the ring's two
                    // slots, which bc holds): rows r0..r1 of that panel lie in bc.
                    dst: unsafe { bc_ptr.add(at2 * kc + r0 * nr) },
                    rows: r1 - r0,
                    ahead,
                    far,
                })
            });
            // This tile's share of the prefetch: up front, or (long shares on normal tiles of a
            // row-major source) inside the kernel's k-loop.
            let mut in_kernel = None;
            if let Some((b, pc2, kc2, j2, w2)) = pf
                && spread
            {
                let t = ir / mr;
                let (r0, r1) = (kc2 * t / tiles, kc2 * (t + 1) / tiles);
                match rm {
                    Some((data, ld)) if r1 - r0 >= K::SPREAD_MIN_ROWS && pending.is_none() => {
                        in_kernel = Some(RowPrefetch {
                            ptr: data.as_ptr().wrapping_add((pc2 + r0) * ld + j2),
                            ld,
                            rows: r1 - r0,
                            width: w2,
                        });
                    }
                    _ if r0 < r1 => b.prefetch_b(pc2 + r0, r1 - r0, j2, w2),
                    _ => {}
                }
            }
            let m = mr.min(mc - ir);
            let ap = ac[ir / mr * a_stride..].as_ptr();
            let (i, j) = (ic + ir, jc + jr);
            // Where the tile goes: C (the dense store), the store's window for it, or the tile
            // buffer handed to `store_tile` (alpha 1, beta 0: this pass's product alone, all NR
            // columns computed, so that the kernel takes its vector store path; the zero-padded
            // panel makes the extra columns harmless; rows past `m` are left untouched, the
            // store reads only `m` rows).
            let window = match sink.direct {
                // SAFETY: the `m × n` window at (i, j) lies inside C (validated by the public
                // entry point), so the offset stays inside C's storage.
                Some(d) => Some((d, unsafe { d.ptr.add(i * d.rs + j * d.cs) }, (i, j))),
                None => sink
                    .store
                    .window(i, j, m, n)
                    .filter(|w| w.bias_len >= m)
                    .map(|w| (w.raw, w.raw.ptr, (0, 0))),
            };
            let (d, cp, (ei, ej), beta, nn) = match window {
                Some((d, cp, at)) => (d, cp, at, if first { d.beta } else { 1.0 }, n),
                None => {
                    let tile = tile_buf.get_or_insert([0.0; MAX_TILE]).as_mut_ptr();
                    let d = DirectRaw {
                        ptr: tile,
                        rs: nr,
                        cs: 1,
                        alpha: 1.0,
                        beta: 0.0,
                        bias: BiasRaw::None,
                        relu: false,
                    };
                    (d, tile, (0, 0), 0.0, nr)
                }
            };
            // SAFETY: `ap`/`bp` start micro-panels of `kc · MR` / `kc · NR` packed values
            // (buffer sizes asserted above, or the handed-over panels' length checked by
            // `b_block`); the `m × nn` block at `cp` is C's window at (i, j) (inside C, validated
            // by the public entry point, and in this thread's range), a window the store vouched
            // for (unsafe `Window::new`: valid and this tile's alone, its row bias covering the m
            // rows, checked by the filter), or the tile buffer (MR × NR values, row stride NR).
            unsafe {
                if let Some((sp, rows)) = conv_rows.take_if(|(_, r)| r.strided) {
                    // The same for a panel of step-2 rows.
                    kern.run_packing_conv(
                        kc,
                        d.alpha,
                        ap,
                        sp,
                        rows.rows2.as_ptr(),
                        rows.rows2.len(),
                        rows.step,
                        bdst,
                        beta,
                        cp,
                        d.rs,
                        d.cs,
                        m,
                    );
                } else if let Some((sp, rows)) = conv_rows.take() {
                    // The panel's first tile packs it through the checked masks
                    // (`ConvRows::resolve`: every lane read lies inside the source).
                    kern.run_packing_conv(
                        kc,
                        d.alpha,
                        ap,
                        sp,
                        rows.rows.as_ptr(),
                        rows.rows.len(),
                        rows.step,
                        bdst,
                        beta,
                        cp,
                        d.rs,
                        d.cs,
                        m,
                    );
                } else if let Some((sp, ld)) = pending.take() {
                    // The panel's first tile: the kernel packs it as it goes (the
                    // source rows are inside the matrix, the packed panel is bc's).
                    kern.run_packing_b(
                        kc, d.alpha, ap, sp, ld, bdst, beta, cp, d.rs, d.cs, m, stream,
                    );
                } else if let Some(rc) = row_copy {
                    // The next panel's rows (inside the matrix, `serial` checked) into the
                    // other slot of the ring, which no tile of this panel reads.
                    kern.run_copying(kc, d.alpha, ap, bp, beta, cp, d.rs, d.cs, m, nn, rc, stream);
                } else if let Some(pf) = in_kernel {
                    kern.run_prefetching(
                        kc, d.alpha, ap, bp, beta, cp, d.rs, d.cs, m, nn, pf, stream,
                    );
                } else if stream {
                    // No rows to prefetch: the prefetching tile only for its streamed C.
                    let none = RowPrefetch {
                        ptr: bp,
                        ld: 0,
                        rows: 0,
                        width: nn.max(1),
                    };
                    kern.run_prefetching(
                        kc, d.alpha, ap, bp, beta, cp, d.rs, d.cs, m, nn, none, true,
                    );
                } else {
                    kern.run(kc, d.alpha, ap, bp, beta, cp, d.rs, d.cs, m, nn);
                }
                if last && d.has_epilogue() {
                    d.epilogue(ei, ej, m, n);
                }
            }
            if window.is_none() {
                let t = Tile {
                    i,
                    j,
                    rows: m,
                    cols: n,
                    data: tile_buf.as_ref().map_or(&[][..], |t| &t[..]),
                    ld: nr,
                    first,
                    last,
                };
                sink.store.store_tile(&t);
            }
            ir += mr;
        }
        jr += nr;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_exactly() {
        for len in [0, 1, 7, 32, 33, 100, 1000] {
            for parts in 1..5 {
                let mut next = 0;
                for t in 0..parts {
                    let (lo, hi) = part(len, 8, parts, t);
                    assert_eq!(lo, next.min(len));
                    assert!(hi >= lo);
                    assert!(lo % 8 == 0 || lo == len);
                    next = hi;
                }
                assert_eq!(next, len);
            }
        }
    }

    /// Small-integer operands of an m×n×k product (B with row stride `ldb`), a C to add to, and
    /// the naive C + A·B: exact in any summation order, so every path must match it bitwise.
    struct IntProduct {
        dims: (usize, usize, usize, usize),
        a: Vec<f32>,
        b: Vec<f32>,
        c0: Vec<f32>,
        want: Vec<f32>,
    }

    impl IntProduct {
        fn new(m: usize, n: usize, k: usize, ldb: usize) -> Self {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
            let b: Vec<f32> = (0..k * ldb).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
            let c0: Vec<f32> = (0..m * n).map(|i| (i % 9) as f32).collect();
            let mut want = c0.clone();
            for i in 0..m {
                for j in 0..n {
                    let dot: f32 = (0..k).map(|p| a[i * k + p] * b[p * ldb + j]).sum();
                    want[i * n + j] += dot;
                }
            }
            Self {
                dims: (m, n, k, ldb),
                a,
                b,
                c0,
                want,
            }
        }

        /// The product by `g` in driver mode `mode`: C + A·B with beta = 1, A·B over a C full
        /// of NaN with beta = 0.
        fn run(&self, g: &crate::Gemm, mode: usize, beta: f32) -> Vec<f32> {
            let (m, n, k, ldb) = self.dims;
            let mut c = if beta == 0.0 {
                vec![f32::NAN; m * n]
            } else {
                self.c0.clone()
            };
            tune::with_mode(mode, || {
                g.sgemm(
                    false, false, m, n, k, 1.0, &self.a, k, &self.b, ldb, beta, &mut c, n,
                )
            })
            .expect("valid sgemm");
            c
        }
    }

    /// A row-major B packed in the first tiles of its panels (the AVX-512 and AVX2 families; the
    /// default copy-then-run elsewhere is not used by the driver) against the same product with B
    /// packed up front (mode 4), with one A block's groups each packed at its place in the B
    /// buffer (mode 6) and the naive product: bitwise equal (small integers, exact in any
    /// order). Shapes: partial last panels, first tiles shorter than MR, k not a multiple of the
    /// 4-step unroll and below / above the C-prefetch rounds, several A blocks (M > MC) and B
    /// blocks, a strided B (ldb > n), beta = 0 over NaN and beta = 1.
    #[test]
    fn fused_b_packing_matches_packing_up_front() {
        for (m, n, k, ldb) in [
            (8usize, 96usize, 37usize, 96usize),
            (13, 100, 5, 101),
            (5, 48, 64, 48),
            (64, 151, 290, 160),
            (350, 200, 133, 200),
            (700, 97, 41, 97),
            (24, 5000, 19, 5003),
            (64, 150, 576, 152),
            (30, 180, 300, 181),
        ] {
            let p = IntProduct::new(m, n, k, ldb);
            let g = crate::Gemm::global().expect("the process-wide kernel");
            let run = |mode: usize, beta: f32| p.run(g, mode, beta);
            let want = p.want.as_slice();
            for beta in [0.0f32, 1.0] {
                let (fused, up_front) = (run(0, beta), run(4, beta));
                assert_eq!(fused, up_front, "m {m} n {n} k {k} ldb {ldb} beta {beta}");
                assert_eq!(run(6, beta), fused, "in place, m {m} n {n} k {k} ldb {ldb}");
                if beta == 1.0 {
                    assert_eq!(fused, want, "m {m} n {n} k {k} ldb {ldb}");
                }
            }
        }
    }

    /// Panels copied ahead by the tiles of the panel before (`serial`'s `copy_ahead`: one pass,
    /// one A block of 4 tiles or more, B's rows a multiple of 4 KiB apart, Intel) against each
    /// panel packed by its own first tile (mode 7), B packed up front (mode 4) and the naive
    /// product: bitwise equal (small integers). Shapes: 4, 5 (a last tile of 1 row) and 8
    /// tiles, one block and several (the table's NC) with a partial last panel, a stride off 4
    /// KiB (no copies), k below and above the k-loop's copy rounds (a tile's share longer than
    /// its rounds), k % 4 != 0, beta 0 over NaN and beta 1. On other CPUs or kernels the modes
    /// coincide.
    #[test]
    fn panels_copied_ahead_match_their_first_tiles() {
        let g = crate::Gemm::global().expect("the process-wide kernel");
        for (m, n, k, ldb) in [
            (32usize, 1000usize, 288usize, 1024usize),
            (33, 1000, 37, 1024),
            (64, 1040, 130, 2048),
            (64, 97, 9, 1024),
            (40, 500, 203, 1024),
            (32, 4200, 20, 5120),
            (64, 300, 50, 300),
        ] {
            let p = IntProduct::new(m, n, k, ldb);
            let run = |mode: usize, beta: f32| p.run(g, mode, beta);
            for beta in [0.0f32, 1.0] {
                let copied = run(0, beta);
                assert_eq!(
                    copied,
                    run(7, beta),
                    "m {m} n {n} k {k} ldb {ldb} beta {beta}"
                );
                assert_eq!(
                    copied,
                    run(4, beta),
                    "m {m} n {n} k {k} ldb {ldb} beta {beta}"
                );
                if beta == 1.0 {
                    assert_eq!(copied, p.want, "m {m} n {n} k {k} ldb {ldb}");
                }
            }
        }
    }

    /// The AVX2 family's fused packing (`Kernel::PACK_PANELS` = 1: each full panel of a 3-panel
    /// group packed by its own first tile) against B packed up front (mode 4), the groups at
    /// their place (mode 6) and the naive product: bitwise equal (small integers). Shapes: one
    /// A block with many groups (the one-panel ring), panels past the last group, a partial
    /// last panel, k % 4 != 0, two passes, several A blocks, blocks of whole groups (480
    /// columns) and a last block of a group, two panels and 5 columns, beta 0 over NaN and
    /// beta 1.
    #[test]
    fn avx2_panels_packed_by_their_own_first_tiles() {
        let Ok(g) = crate::Gemm::new(crate::Isa::Avx2) else {
            return;
        };
        for (m, n, k, ldb) in [
            (64usize, 50 * 16 + 7, 290usize, 50 * 16 + 7),
            (6, 48 * 3, 33, 48 * 3 + 16),
            (13, 16 * 7, 577, 16 * 7),
            (64, 1000, 576, 1024),
            (700, 200, 100, 200),
            (64, 1045, 290, 1048),
        ] {
            let p = IntProduct::new(m, n, k, ldb);
            let run = |mode: usize, beta: f32| p.run(&g, mode, beta);
            let want = p.want.as_slice();
            for beta in [0.0f32, 1.0] {
                let fused = run(0, beta);
                assert_eq!(
                    fused,
                    run(4, beta),
                    "m {m} n {n} k {k} ldb {ldb} beta {beta}"
                );
                assert_eq!(run(6, beta), fused, "in place, m {m} n {n} k {k} ldb {ldb}");
                if beta == 1.0 {
                    assert_eq!(fused, want, "m {m} n {n} k {k} ldb {ldb}");
                }
            }
        }
    }

    /// Several A blocks and passes (the deeper passes of `Kernel::DEEPER_PASSES`, AVX-512)
    /// against the table's block sizes (mode 5) and the naive product: bitwise equal (small
    /// integers). m = 700 > MC, k = 1100 > KC: passes 4/3 deeper, a short last one, edge rows.
    #[test]
    fn deeper_passes_match_the_table_sizes() {
        let (m, n, k) = (700usize, 100usize, 1100usize);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 3) as f32 - 1.0).collect();
        let mut want = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        let run = |mode: usize| {
            let mut c = vec![f32::NAN; m * n];
            tune::with_mode(mode, || {
                crate::sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)
            })
            .expect("valid sgemm");
            c
        };
        let (deep, table) = (run(0), run(5));
        assert_eq!(deep, want);
        assert_eq!(table, want);
    }

    /// One A block packed once (m <= MC), several passes and several B blocks, row-major B
    /// packed by the first tiles; `Vec`s from malloc start off a cache line, so with ldc a
    /// multiple of 16 the driver runs a narrow first block up to C's first line boundary.
    /// beta = 0 over NaN and beta = 1 against the naive product: bitwise equal (small integers).
    #[test]
    fn single_a_block_many_passes_and_blocks() {
        for (m, n, k) in [
            (40usize, 3000usize, 1000usize),
            (9, 1100, 777),
            (64, 700, 1537),
            (40, 3136, 1000),
            (7, 1104, 700),
            // Several passes and columns past NC: several blocks also where the B block is a
            // one-panel ring (wide blocks).
            (16, 4200, 600),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 3) as f32 - 1.0).collect();
            let c0: Vec<f32> = (0..m * n).map(|i| (i % 9) as f32).collect();
            for (beta, off) in [(0.0f32, 0usize), (1.0, 0), (0.0, 4), (1.0, 12)] {
                // C and B `off` values into their storage: rows off a line boundary by
                // malloc's offset plus `off` floats.
                let mut bs = vec![0.0f32; k * n + off];
                bs[off..].copy_from_slice(&b);
                let mut want = vec![0.0f32; m * n];
                for i in 0..m {
                    for j in 0..n {
                        let dot: f32 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
                        want[i * n + j] = dot + if beta == 0.0 { 0.0 } else { c0[i * n + j] };
                    }
                }
                let mut cs = vec![f32::NAN; m * n + off];
                if beta != 0.0 {
                    cs[off..].copy_from_slice(&c0);
                }
                crate::sgemm(
                    false,
                    false,
                    m,
                    n,
                    k,
                    1.0,
                    &a,
                    k,
                    &bs[off..],
                    n,
                    beta,
                    &mut cs[off..],
                    n,
                )
                .expect("valid sgemm");
                assert_eq!(
                    &cs[off..],
                    &want[..],
                    "m {m} n {n} k {k} beta {beta} off {off}"
                );
            }
        }
    }

    /// Several A blocks (m > MC) over a row-major B and a dense C whose rows start off a cache
    /// line: the head columns up to C's first line boundary run beside the first real block on
    /// each packed A block. Several passes, several B blocks, edge rows; beta = 0 over NaN and
    /// beta = 1, against the naive product: bitwise equal (small integers).
    #[test]
    fn several_a_blocks_with_a_side_head() {
        for (m, n, k) in [
            (700usize, 100usize, 600usize),
            (1100, 4200, 70),
            (523, 48, 1100),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 3) as f32 - 1.0).collect();
            let c0: Vec<f32> = (0..m * n).map(|i| (i % 9) as f32).collect();
            let mut dot = vec![0.0f32; m * n];
            for i in 0..m {
                for p in 0..k {
                    let x = a[i * k + p];
                    for j in 0..n {
                        dot[i * n + j] += x * b[p * n + j];
                    }
                }
            }
            for (beta, off) in [(0.0f32, 0usize), (1.0, 4), (0.0, 12)] {
                let mut bs = vec![0.0f32; k * n + off];
                bs[off..].copy_from_slice(&b);
                let mut cs = vec![f32::NAN; m * n + off];
                if beta != 0.0 {
                    cs[off..].copy_from_slice(&c0);
                }
                crate::sgemm(
                    false,
                    false,
                    m,
                    n,
                    k,
                    1.0,
                    &a,
                    k,
                    &bs[off..],
                    n,
                    beta,
                    &mut cs[off..],
                    n,
                )
                .expect("valid sgemm");
                for (x, (&d, &c)) in cs[off..].iter().zip(dot.iter().zip(&c0)) {
                    let want = d + if beta == 0.0 { 0.0 } else { c };
                    assert_eq!(*x, want, "m {m} n {n} k {k} beta {beta} off {off}");
                }
            }
        }
    }

    /// `starts.len()` OS threads run `serial` on the `m × n` product sharing its column blocks;
    /// thread `t` starts once `starts[t]` blocks are taken (`usize::MAX`: once another
    /// thread has finished). C and B have rows of `n` rounded up to 16 floats and start `off`
    /// floats into their storage (a head of columns up to C's first cache line). C is NaN for
    /// beta = 0 (an element no thread writes stays NaN) and 1 for beta = 1 (an element two
    /// threads compute gets A·B twice).
    #[allow(clippy::too_many_arguments)]
    fn run_shared<K: Kernel>(
        kern: K,
        bs: BlockSizes,
        (m, n, k): (usize, usize, usize),
        a: &[f32],
        b: &[f32],
        off: usize,
        beta: f32,
        starts: &[usize],
    ) -> Vec<f32> {
        use crate::{DenseStore, MatMut, MatRef};
        let ld = n.div_ceil(16) * 16;
        let mut bs_data = vec![0.0f32; k * ld + off];
        for p in 0..k {
            bs_data[off + p * ld..][..n].copy_from_slice(&b[p * n..][..n]);
        }
        let mut c = vec![if beta == 0.0 { f32::NAN } else { 1.0 }; m * ld + off];
        let av = MatRef::row_major("a", a, m, k, k).unwrap();
        let bv = MatRef::row_major("b", &bs_data[off..], k, n, ld).unwrap();
        let cv = MatMut::row_major("c", &mut c[off..], m, n, ld).unwrap();
        let mut store = DenseStore::new(cv, 1.0, beta);
        let direct = store.direct().map(|d| d.raw);
        let sink = Sink {
            direct,
            store: &store,
        };
        let shares: Vec<AtomicU64> = starts.iter().map(|_| AtomicU64::new(0)).collect();
        let taken = |shares: &[AtomicU64]| -> usize {
            shares
                .iter()
                .map(|x| {
                    let x = x.load(Ordering::Relaxed);
                    ((x & 0xffff_ffff) + (x >> 32)) as usize
                })
                .sum()
        };
        let done = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for (own, &start) in starts.iter().enumerate() {
                let (sink, shares, done, av, bv) = (&sink, &shares[..], &done, &av, &bv);
                s.spawn(move || {
                    while (start == usize::MAX && done.load(Ordering::Acquire) == 0)
                        || (start != usize::MAX
                            && taken(shares) < start
                            && done.load(Ordering::Acquire) == 0)
                    {
                        std::thread::yield_now();
                    }
                    let cols = Columns {
                        range: (0, n),
                        threads: starts.len(),
                        own,
                        shares,
                    };
                    with_workspace(|ws| {
                        serial(
                            kern,
                            bs,
                            Exact::default(),
                            (0, m),
                            cols,
                            k,
                            av,
                            bv,
                            sink,
                            ws,
                            None,
                        )
                    });
                    done.fetch_add(1, Ordering::Release);
                });
            }
        });
        (0..m)
            .flat_map(|i| c[off + i * ld..][..n].to_vec())
            .collect()
    }

    /// Threads sharing a row range's column blocks: a thread that starts late (after the others
    /// took some blocks, its own included, or after one finished them all) computes only what is
    /// left, and every block, the head up to C's first cache line included, is computed exactly
    /// once (NaN where none wrote). Every family, the
    /// cache-derived block sizes and small ones; against the naive product (small integers).
    #[test]
    fn late_threads_take_the_blocks_left() {
        use crate::isa::Family;
        let (m, n, k) = (21usize, 1501usize, 50usize);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let mut want = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        for isa in crate::Isa::available() {
            let g = crate::Gemm::new(isa).unwrap();
            let (mr, nr) = g.tile();
            let small = BlockSizes {
                mc: 2 * mr,
                kc: 16,
                nc: 3 * nr,
            };
            for bs in [g.block_sizes(), small] {
                for starts in [
                    &[0, usize::MAX][..],
                    &[0, 2],
                    &[0, 9],
                    &[0, 0],
                    &[0, 1, 5],
                    &[usize::MAX, 0, 3],
                ] {
                    for (off, beta) in [(0, 0.0), (4, 0.0), (4, 1.0)] {
                        let shape = (m, n, k);
                        let got = match Family::require(isa).unwrap() {
                            Family::Scalar(kern) => {
                                run_shared(kern, bs, shape, &a, &b, off, beta, starts)
                            }
                            #[cfg(target_arch = "x86_64")]
                            Family::Avx2(kern) => {
                                run_shared(kern, bs, shape, &a, &b, off, beta, starts)
                            }
                            #[cfg(target_arch = "x86_64")]
                            Family::Avx512(kern) => {
                                run_shared(kern, bs, shape, &a, &b, off, beta, starts)
                            }
                        };
                        let want: Vec<f32> = want.iter().map(|&x| x + beta).collect();
                        assert_eq!(
                            got, want,
                            "{isa} {bs:?} starts {starts:?} off {off} beta {beta}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn grid_prefers_the_long_side() {
        assert_eq!(grid(2, 64, 50176, 8, 32), (1, 2));
        assert_eq!(grid(2, 50176, 64, 8, 32), (2, 1));
        assert_eq!(grid(2, 4, 50176, 8, 32), (1, 2));
        assert_eq!(grid(4, 1000, 1000, 8, 32), (2, 2));
    }
}
