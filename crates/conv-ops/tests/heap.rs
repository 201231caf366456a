//! What every algorithm really takes from the heap, counted by a global allocator on the one
//! thread that runs the pass: beyond `workspace_bytes`, nothing that grows with the batch. The
//! fused (memory-lean) algorithms keep per-thread buffers across calls (packing panels, C
//! panels, tiny planes' position-major copies); doubling the batch must not grow them, and a
//! call's transient peak above `workspace_bytes` must not grow either.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use conv_ops::testing::uniform;
use conv_ops::{
    BackwardDataAlgo, BackwardFilterAlgo, ConvGeometry, ForwardAlgo, Pass, Workspace,
    backward_data, backward_filter, forward, workspace_bytes,
};

/// Counts this thread's live heap bytes and their peak (frees of memory allocated on another
/// thread count too, so `live` can go below its start: only differences are used).
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(bytes: isize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get() + bytes;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

// SAFETY: every call forwards to the system allocator with the same arguments; the counters
// are const-initialised thread-locals without destructors (no allocation, no reentrancy).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// (peak above the start during `f`, bytes still held after it) on this thread.
fn measure(f: impl FnOnce()) -> (isize, isize) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    f();
    (PEAK.with(Cell::get) - start, LIVE.with(Cell::get) - start)
}

/// One call of `pass` on `g` with a non-persistent workspace (created and dropped inside);
/// false when the algorithm refuses the geometry.
fn call(g: &ConvGeometry, pass: Pass, t: &mut Tensors) -> bool {
    let mut ws = Workspace::new(false);
    let r = match pass {
        Pass::Forward(a) => forward(g, &t.x, &t.w, None, false, &mut t.y, a, &mut ws),
        Pass::BackwardData(a) => backward_data(g, &t.y, &t.w, &mut t.x, a, &mut ws),
        Pass::BackwardFilter(a) => backward_filter(g, &t.x, &t.y, &mut t.w, a, &mut ws),
    };
    r.is_ok()
}

struct Tensors {
    x: Vec<f32>,
    w: Vec<f32>,
    y: Vec<f32>,
}

/// Per pass at `g`'s batch: (the peak above `workspace_bytes` of a call after three warm-up
/// calls, the bytes the first call kept, the bytes the calls after it kept), or None when the
/// algorithm refuses `g`. (Some of convgemm's per-thread tables fill over the first calls.)
fn profile(g: &ConvGeometry) -> Vec<Option<(isize, isize, isize)>> {
    let mut t = Tensors {
        x: uniform(1, g.x_len()),
        w: uniform(2, g.w_len()),
        y: uniform(3, g.y_len()),
    };
    Pass::ALL
        .iter()
        .map(|&pass| {
            let mut ok = true;
            let (_, first) = measure(|| ok = call(g, pass, &mut t));
            let (_, warm) = measure(|| {
                for _ in 0..2 {
                    ok &= call(g, pass, &mut t);
                }
            });
            let (peak, after) = measure(|| ok &= call(g, pass, &mut t));
            ok.then(|| {
                (
                    peak - workspace_bytes(g, pass) as isize,
                    first,
                    warm + after,
                )
            })
        })
        .collect()
}

fn with_batch(g: &ConvGeometry, n: usize) -> ConvGeometry {
    ConvGeometry::from_parts(
        n,
        g.in_channels(),
        g.out_channels(),
        g.input(),
        g.kernel(),
        g.stride(),
        g.dilation(),
        g.pad_before(),
        g.pad_after(),
        g.groups(),
    )
    .unwrap()
}

/// The memory-lean algorithms (every fused one, and the direct ones).
fn lean(pass: Pass) -> bool {
    !matches!(
        pass,
        Pass::Forward(ForwardAlgo::Im2colGemm)
            | Pass::BackwardData(BackwardDataAlgo::GemmCol2im)
            | Pass::BackwardFilter(BackwardFilterAlgo::Im2colGemmT)
            | Pass::BackwardFilter(BackwardFilterAlgo::ReindexConvgemm)
    )
}

/// Tiny planes (run pair by pair on position-major copies of a block of images): at twice the
/// batch no algorithm's transient peak above `workspace_bytes` grows, and no lean algorithm
/// keeps more than it kept at the first batch (the batches are at least one block: 256 images
/// of 256 channels on 2×2, 227 of 128 on 3×3, 2730 of 96 on 1×1; 20 of 256 on 7², run tap
/// by tap on position-major copies too, and the transposed convgemm there, whose chunk table
/// is per position of an image). The first batch's first
/// calls start from a fresh thread, so that growth is what a pass keeps on a thread that ran
/// the layer at its first batch. Fails at 3d55102 (tapwise's copies held the whole batch).
#[test]
fn no_workspace_grows_with_the_batch_on_tiny_planes() {
    let geo = |n, c, k, sp: &[usize]| {
        ConvGeometry::from_parts(n, c, k, sp, &[3, 3], &[1], &[1], &[1], &[1], 1).unwrap()
    };
    let layers = [
        geo(256, 256, 256, &[2, 2]),
        geo(227, 128, 128, &[3, 3]),
        geo(2731, 64, 96, &[1, 1]),
        // `tapsum` (many channels on small planes): blocks of 20 images.
        geo(21, 256, 256, &[7, 7]),
    ];
    let mut failures = Vec::new();
    for g in layers {
        // A fresh thread: the per-thread buffers start empty.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (small, large) =
            pool.install(|| (profile(&g), profile(&with_batch(&g, 2 * g.batch()))));
        for ((&pass, s), l) in Pass::ALL.iter().zip(small).zip(large) {
            // On 7² the passes that run tap by tap, and the transposed convgemm (its chunks
            // cached per position of an image; cached per block of rows until session 21,
            // they grew with the batch).
            if g.input() == [7, 7]
                && !matches!(
                    pass,
                    Pass::Forward(ForwardAlgo::Convgemm)
                        | Pass::BackwardData(BackwardDataAlgo::Deconvgemm)
                        | Pass::BackwardData(BackwardDataAlgo::FlippedConvgemm)
                        | Pass::BackwardFilter(BackwardFilterAlgo::ConvgemmTrans)
                )
            {
                continue;
            }
            let (Some(s), Some(l)) = (s, l) else {
                failures.push(format!("{:?} {pass:?} refused", g.input()));
                continue;
            };
            if l.0 != s.0 || s.2 != 0 || l.2 != 0 || (lean(pass) && l.1 != 0) {
                failures.push(format!(
                    "{:?} b{} {pass:?}: (peak above workspace_bytes, first call kept, \
                     later calls kept) {s:?} at b{1}, {l:?} at twice the batch",
                    g.input(),
                    g.batch()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The tables of the panels `Im2colB` packs (kept per thread across calls, one set per view)
/// are counted exactly and bounded: on a fresh thread, what packing B from x keeps on the heap
/// is what `panel_table_bytes` reports, never more than `PANEL_TABLE_BYTES` (nor at its peak
/// while packing), over more views than a thread keeps tables for, a view whose tables alone
/// pass the bound (a 3-D plane of 50176 positions, 27 taps, 16-wide panels: 3136 panel
/// positions) and a view with more positions than the bound has slots for; every panel packs
/// what im2col holds; `release_workspaces` frees exactly what was counted. Fails if a table
/// (or a scratch) is left out of the count or the release, or if the bound is not enforced.
#[test]
fn panel_tables_are_counted_and_bounded() {
    use conv_ops::{Im2colB, PANEL_TABLE_BYTES, im2col, panel_table_bytes, release_workspaces};
    use core_blas::PackB;

    let pad = |g: ConvGeometry, p: &[usize]| g.with_padding(p).unwrap();
    let small1 = pad(ConvGeometry::new(2, 3, 2, &[9, 11], &[3, 3]).unwrap(), &[1]);
    let small2 = pad(
        ConvGeometry::new(2, 3, 2, &[6, 7], &[3, 2]).unwrap(),
        &[1, 0],
    );
    let big = pad(
        ConvGeometry::new(1, 1, 1, &[16, 56, 56], &[3, 3, 3]).unwrap(),
        &[1],
    );
    let wide = ConvGeometry::new(1, 1, 1, &[1024, 1040], &[1, 1]).unwrap();
    // (layer, panel width): six views of the small layers, more than a thread keeps.
    let smalls: Vec<(ConvGeometry, usize)> = [small1, small2]
        .into_iter()
        .flat_map(|g| [16, 48, 8].map(|nr| (g, nr)))
        .collect();
    let mut views = smalls.clone();
    views.push((big, 16));
    views.extend(smalls.iter().take(3));
    views.push((wide, 48));
    views.extend(smalls.iter().rev().take(4));

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        release_workspaces();
        let start = LIVE.with(Cell::get);
        let mut saw_big = 0;
        for (vi, &(g, nr)) in views.iter().enumerate() {
            let x = uniform(vi as u64, g.x_len());
            let (rows, cols) = im2col::im2col_shape(&g);
            let mut col = vec![0.0; rows * cols];
            im2col::im2col(&g, 0, &x, &mut col).unwrap();
            let kc = 5.min(rows);
            let mut dst = vec![f32::NAN; cols.div_ceil(nr) * nr * kc];
            let b = Im2colB::new(&g, 0, &x).with_fused_packing();
            // The heap without the tables, and their peak while packing.
            let base = LIVE.with(Cell::get) - panel_table_bytes() as isize;
            PEAK.with(|p| p.set(LIVE.with(Cell::get)));
            for round in 0..2 {
                for pc in (0..rows).step_by(kc) {
                    let kc = kc.min(rows - pc);
                    b.pack_b(pc, kc, 0, cols, nr, &mut dst);
                    for (i, v) in dst[..cols.div_ceil(nr) * nr * kc].iter().enumerate() {
                        let (panel, p, l) = (i / (kc * nr), i / nr % kc, i % nr);
                        let j = panel * nr + l;
                        let want = if j < cols {
                            col[(pc + p) * cols + j]
                        } else {
                            0.0
                        };
                        assert_eq!(*v, want, "view {vi} round {round} rows {pc}+{kc} col {j}");
                    }
                }
            }
            let peak = PEAK.with(Cell::get) - base;
            let held = panel_table_bytes();
            let kept = LIVE.with(Cell::get) - base;
            assert_eq!(
                kept,
                held as isize,
                "view {vi} ({:?}, nr {nr}): the thread keeps {kept} bytes of tables, \
                 panel_table_bytes says {held}",
                g.input()
            );
            assert!(
                held <= PANEL_TABLE_BYTES && peak <= PANEL_TABLE_BYTES as isize,
                "view {vi} ({:?}, nr {nr}): {held} bytes held, {peak} at the peak",
                g.input()
            );
            if g == big {
                saw_big = held;
            }
        }
        // The bound binds: the large view's tables fill most of it.
        assert!(saw_big > PANEL_TABLE_BYTES / 2, "large view {saw_big}");
        // A forward convgemm whose tables pass the bound (C3D's kernel on twice its depth:
        // its view starts its tables over during the call) against the naive reference, the
        // tables within the bound after it.
        {
            let g = pad(
                ConvGeometry::new(1, 2, 3, &[16, 56, 56], &[3, 3, 3]).unwrap(),
                &[1],
            );
            let (x, w) = (uniform(11, g.x_len()), uniform(12, g.w_len()));
            let mut y = vec![f32::NAN; g.y_len()];
            let mut want = vec![0.0; g.y_len()];
            let mut ws = Workspace::new(false);
            for _ in 0..2 {
                forward(
                    &g,
                    &x,
                    &w,
                    None,
                    false,
                    &mut y,
                    ForwardAlgo::Convgemm,
                    &mut ws,
                )
                .unwrap();
                conv_ops::reference::forward(&g, &x, &w, None, &mut want).unwrap();
                conv_ops::testing::Tolerance::for_f32_sum(2 * 27)
                    .check("y", &y, &want)
                    .unwrap();
                let held = panel_table_bytes();
                assert!(held <= PANEL_TABLE_BYTES, "forward over the bound: {held}");
            }
        }
        release_workspaces();
        core_blas::pack::release_workspaces();
        // Views again after the forward: the count, the release.
        for &(g, nr) in &views[..5] {
            let x = uniform(9, g.x_len());
            let (rows, cols) = im2col::im2col_shape(&g);
            let mut dst = vec![0.0; cols.div_ceil(nr) * nr * rows];
            Im2colB::new(&g, 0, &x)
                .with_fused_packing()
                .pack_b(0, rows, 0, cols, nr, &mut dst);
        }
        let held = panel_table_bytes();
        let kept = LIVE.with(Cell::get) - start;
        assert_eq!(kept, held as isize, "kept {kept}, counted {held}");
        assert_eq!(release_workspaces(), held, "release frees what was counted");
        assert_eq!(
            LIVE.with(Cell::get),
            start,
            "nothing kept after the release"
        );
        assert_eq!(panel_table_bytes(), 0);
    });
}

/// `release_workspaces` frees every per-thread buffer the transposed convgemm's backward-filter
/// keeps: on a fresh thread, a backward-filter on small output planes (where
/// [`conv_ops::Im2colTB`] keeps a chunk table per output position of an image and tap), a
/// strided layer and a 3-D one, followed by the release of conv-ops' and core-blas's per-thread
/// buffers, leaves the thread holding nothing more than before; the results match the naive
/// reference. (Lazily made process-wide state is made first on another thread.) Fails if the
/// transposed convgemm's scratch is left out of the release.
#[test]
fn release_frees_the_transposed_convgemm_tables() {
    let layers = [
        ConvGeometry::from_parts(3, 16, 8, &[14, 13], &[3, 3], &[1], &[1], &[1], &[1], 1).unwrap(),
        ConvGeometry::from_parts(2, 8, 16, &[17, 15], &[3, 3], &[2], &[1], &[1], &[1], 1).unwrap(),
        ConvGeometry::from_parts(2, 8, 8, &[3, 6, 7], &[3, 3, 3], &[1], &[1], &[1], &[1], 1)
            .unwrap(),
    ];
    let fresh = || {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
    };
    for g in &layers {
        let (x, dy) = (uniform(21, g.x_len()), uniform(22, g.y_len()));
        let mut want = vec![0.0; g.w_len()];
        conv_ops::reference::backward_filter(g, &x, &dy, &mut want).unwrap();
        let run = |dw: &mut [f32]| {
            let mut ws = Workspace::new(false);
            backward_filter(g, &x, &dy, dw, BackwardFilterAlgo::ConvgemmTrans, &mut ws).unwrap();
        };
        let mut dw = vec![f32::NAN; g.w_len()];
        fresh().install(|| run(&mut dw));
        dw.fill(f32::NAN);
        let (peak, kept) = fresh().install(|| {
            measure(|| {
                run(&mut dw);
                conv_ops::release_workspaces();
                core_blas::pack::release_workspaces();
            })
        });
        let sums = g.batch() * g.output_spatial_len();
        conv_ops::testing::Tolerance::for_f32_sum(sums)
            .check("dw", &dw, &want)
            .unwrap();
        assert!(peak > 0, "{:?}: the pass allocated nothing", g.input());
        assert_eq!(
            kept,
            0,
            "{:?}: kept {kept} bytes after the release",
            g.input()
        );
    }
}
