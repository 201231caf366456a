//! Exact block sizes (`Gemm::with_exact_block_sizes`, what the `CORE_BLAS_MC/KC/NC` variables
//! set): the driver packs exactly the blocks they name, where `with_block_sizes` lets it adapt
//! them (deeper passes, equal splits of k and m, the B block's L2 width for one A block).

mod common;

use std::sync::Mutex;

use core_blas::{BlockSizes, DenseStore, Gemm, MatMut, MatRef, PackA, PackB};

/// A row-major matrix that records the blocks it is asked to pack: `(ic, mc, pc, kc)` as A,
/// `(pc, kc, jc, nc)` as B. As B it hands over no row-major storage, so the driver packs each
/// block through `pack_b` (never in the first tiles).
struct Recorder<'a> {
    m: MatRef<'a>,
    blocks: Mutex<Vec<(usize, usize, usize, usize)>>,
}

impl<'a> Recorder<'a> {
    fn new(m: MatRef<'a>) -> Self {
        Self {
            m,
            blocks: Mutex::new(Vec::new()),
        }
    }

    /// The distinct blocks asked for, in order.
    fn blocks(&self) -> Vec<(usize, usize, usize, usize)> {
        let mut v = self.blocks.lock().unwrap().clone();
        v.sort_unstable();
        v.dedup();
        v
    }
}

impl PackA for Recorder<'_> {
    fn rows(&self) -> usize {
        PackA::rows(&self.m)
    }
    fn cols(&self) -> usize {
        PackA::cols(&self.m)
    }
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        self.blocks.lock().unwrap().push((ic, mc, pc, kc));
        self.m.pack_a(ic, mc, pc, kc, mr, dst);
    }
}

impl PackB for Recorder<'_> {
    fn rows(&self) -> usize {
        PackB::rows(&self.m)
    }
    fn cols(&self) -> usize {
        PackB::cols(&self.m)
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        self.blocks.lock().unwrap().push((pc, kc, jc, nc));
        self.m.pack_b(pc, kc, jc, nc, nr, dst);
    }
}

/// `(start, len)` of the blocks of `step` over `0..len` (the last one shorter).
fn cuts(len: usize, step: usize) -> Vec<(usize, usize)> {
    (0..len)
        .step_by(step)
        .map(|s| (s, step.min(len - s)))
        .collect()
}

/// Runs `C = A · B` on one thread with the recorders and returns (A's blocks, B's blocks, C).
#[allow(clippy::type_complexity)]
fn record(
    g: &Gemm,
    (m, n, k): (usize, usize, usize),
) -> (
    Vec<(usize, usize, usize, usize)>,
    Vec<(usize, usize, usize, usize)>,
    Vec<f32>,
) {
    // Small integers: every order of the sums is exact.
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 3) as f32 - 1.0).collect();
    let mut c = vec![f32::NAN; m * n];
    let ra = Recorder::new(MatRef::row_major("a", &a, m, k, k).unwrap());
    let rb = Recorder::new(MatRef::row_major("b", &b, k, n, n).unwrap());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        let mut store = DenseStore::new(MatMut::row_major("c", &mut c, m, n, n).unwrap(), 1.0, 0.0);
        g.gemm_with(&ra, &rb, &mut store).unwrap();
    });
    let mut want = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    assert_eq!(c, want, "{} {m}x{n}x{k}", g.kernel_name());
    (ra.blocks(), rb.blocks(), c)
}

/// Several A blocks and passes: exact MC and KC pack A blocks of MC rows (rounded up to MR) over
/// passes of KC, the last of each shorter; the adapted sizes of `with_block_sizes` pack others
/// (equal passes of k = 1100 at KC 256: five of 220; AVX-512 passes 4/3 deeper).
#[test]
fn exact_mc_kc_pack_the_named_blocks() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.tile();
        let (m, n, k) = (700, 3 * nr + 5, 1100);
        let bs = BlockSizes {
            mc: 7 * mr + 1,
            kc: 256,
            nc: 4096,
        };
        let mc = (bs.mc).div_ceil(mr) * mr;
        let mut want: Vec<(usize, usize, usize, usize)> = cuts(m, mc)
            .into_iter()
            .flat_map(|(ic, h)| {
                cuts(k, bs.kc)
                    .into_iter()
                    .map(move |(pc, d)| (ic, h, pc, d))
            })
            .collect();
        want.sort_unstable();
        let (blocks_a, _, _) = record(&g.with_exact_block_sizes(bs).unwrap(), (m, n, k));
        assert_eq!(blocks_a, want, "{} exact", g.kernel_name());
        let (adapted, _, _) = record(&g.with_block_sizes(bs).unwrap(), (m, n, k));
        assert_ne!(adapted, want, "{} adapted", g.kernel_name());
    }
}

/// One A block: exact NC packs B blocks of NC columns (rounded up to NR) for each pass, where
/// `with_block_sizes` caps a block's width by the A block's L2 budget (here 2 · MR rows deep in
/// KC: a few NR wide).
#[test]
fn exact_nc_packs_the_named_b_blocks() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.tile();
        let (m, n, k) = (2 * mr, 40 * nr + 3, 256);
        let bs = BlockSizes {
            mc: 2 * mr,
            kc: 128,
            nc: 9 * nr - 1,
        };
        let nc = bs.nc.div_ceil(nr) * nr;
        let mut want: Vec<(usize, usize, usize, usize)> = cuts(k, bs.kc)
            .into_iter()
            .flat_map(|(pc, d)| cuts(n, nc).into_iter().map(move |(jc, w)| (pc, d, jc, w)))
            .collect();
        want.sort_unstable();
        let (_, blocks_b, _) = record(&g.with_exact_block_sizes(bs).unwrap(), (m, n, k));
        assert_eq!(blocks_b, want, "{} exact", g.kernel_name());
        let (_, adapted, _) = record(&g.with_block_sizes(bs).unwrap(), (m, n, k));
        assert_ne!(adapted, want, "{} adapted", g.kernel_name());
    }
}
