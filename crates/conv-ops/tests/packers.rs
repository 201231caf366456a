//! The convgemm B packers against the explicit im2col matrix, block by block, in the layout
//! core-blas's micro-kernels read: blocks of every width (one micro-panel, as core-blas's
//! small-m schedule asks, up to many), panel widths 4-32, visited out of order and alternating
//! between two geometries on one thread, so that tables cached across calls are exercised
//! with a changing geometry, position and image.

mod common;

use conv_ops::testing::uniform;
use conv_ops::{ConvGeometry, Im2colB, Im2colTB, im2col};
use core_blas::{Chunk, ConvPanel, PackB};
use proptest::prelude::*;

/// `(pc, kc, jc, nc)` blocks covering a `rows × cols` matrix, `kc` and `nc` from `widths`.
fn blocks(rows: usize, cols: usize, kc: usize, nc: usize) -> Vec<(usize, usize, usize, usize)> {
    let mut out = Vec::new();
    for pc in (0..rows).step_by(kc) {
        for jc in (0..cols).step_by(nc) {
            out.push((pc, kc.min(rows - pc), jc, nc.min(cols - jc)));
        }
    }
    out
}

/// Packs block `(pc, kc, jc, nc)` of `b` with panel width `nr` and checks it against `m`
/// (`m(p, j)` = B's element), zeros past the last column included.
fn check_block<B: PackB>(
    b: &B,
    m: &dyn Fn(usize, usize) -> f32,
    (pc, kc, jc, nc): (usize, usize, usize, usize),
    nr: usize,
) -> Result<(), TestCaseError> {
    let mut dst = vec![f32::NAN; nc.div_ceil(nr) * nr * kc];
    b.pack_b(pc, kc, jc, nc, nr, &mut dst);
    for q in 0..nc.div_ceil(nr) {
        for p in 0..kc {
            for l in 0..nr {
                let got = dst[q * kc * nr + p * nr + l];
                let j = q * nr + l;
                let want = if j < nc { m(pc + p, jc + j) } else { 0.0 };
                prop_assert!(
                    got == want,
                    "block {:?} nr {} panel {} row {} lane {}: {} != {}",
                    (pc, kc, jc, nc),
                    nr,
                    q,
                    p,
                    l,
                    got,
                    want
                );
            }
        }
    }
    Ok(())
}

/// Packs every block of both packers over `geoms` (panel width `nr`, blocks `kc` rows and
/// `panels` micro-panels), the blocks of all geometries interleaved and shuffled by `order`.
/// For every full `nr`-wide panel of `kc`-row blocks of `b` that [`PackB::conv_panel`]
/// describes, the described values (read lane by lane from the slice it returns) against `m`;
/// a panel it does not describe must be one whose chunks are not all step-1 lines. Returns
/// how many panels were described.
fn check_conv_panels(
    b: &Im2colB<'_>,
    m: &dyn Fn(usize, usize) -> f32,
    rows: usize,
    cols: usize,
    kc: usize,
    nr: usize,
) -> Result<usize, TestCaseError> {
    let mut out = ConvPanel::default();
    let mut described = 0;
    let nch = nr / 16;
    for pc in (0..rows).step_by(kc) {
        let kc = kc.min(rows - pc);
        for j in (0..cols / nr * nr).step_by(nr) {
            let Some(src) = b.conv_panel(pc, kc, j, nr, &mut out) else {
                continue;
            };
            described += 1;
            prop_assert_eq!(out.taps.len(), out.period * nch);
            prop_assert!(out.first < out.period);
            for p in 0..kc {
                let t = (out.first + p) % out.period;
                let off = out.base + ((out.first + p) / out.period) as isize * out.step;
                for q in 0..nch {
                    let c = out.taps[t * nch + q];
                    for l in 0..16 {
                        let bit = 1u16 << l;
                        let got = match c {
                            Chunk::Lines {
                                step,
                                m1,
                                m2,
                                off1,
                                off2,
                            } => {
                                let s = step as isize * l as isize;
                                if m1 & bit != 0 {
                                    Some(off + off1 + s)
                                } else if m2 & bit != 0 {
                                    Some(off + off2 + s)
                                } else {
                                    None
                                }
                            }
                            Chunk::Gather { .. } => {
                                // The driver falls back to pack_b for these.
                                prop_assert!(step_not_one(&out.taps));
                                continue;
                            }
                        }
                        .map(|o| {
                            assert!(o >= 0 && (o as usize) < src.len(), "offset {o} outside");
                            src[o as usize]
                        })
                        .unwrap_or(0.0);
                        let want = m(pc + p, j + 16 * q + l);
                        prop_assert!(
                            got == want,
                            "pc {} kc {} j {} nr {} row {} lane {}: {} != {}",
                            pc,
                            kc,
                            j,
                            nr,
                            p,
                            16 * q + l,
                            got,
                            want
                        );
                    }
                }
            }
        }
    }
    Ok(described)
}

fn step_not_one(taps: &[Chunk]) -> bool {
    taps.iter()
        .any(|c| !matches!(c, Chunk::Lines { step: 1, .. }))
}

/// [`check_conv_panels`] on each geometry of `geoms` with panel widths 16, 32, 48.
fn check_conv_geometries(geoms: &[ConvGeometry], kc: usize) -> Result<usize, TestCaseError> {
    let mut described = 0;
    for (i, g) in geoms.iter().enumerate() {
        let x = uniform(20 + i as u64, g.x_len());
        let (rows, cols) = im2col::im2col_shape(g);
        let grp = g.groups() - 1;
        let mut col = vec![0f32; rows * cols];
        im2col::im2col(g, grp, &x, &mut col).unwrap();
        let b = Im2colB::new(g, grp, &x).with_fused_packing();
        for nr in [16, 32, 48] {
            described += check_conv_panels(&b, &|p, j| col[p * cols + j], rows, cols, kc, nr)?;
        }
    }
    Ok(described)
}

fn check_geometries(
    geoms: &[ConvGeometry],
    nr: usize,
    kc: usize,
    panels: usize,
    order: u64,
) -> Result<(), TestCaseError> {
    let mut cases = Vec::new();
    for (i, g) in geoms.iter().enumerate() {
        let x = uniform(10 + i as u64, g.x_len());
        let (rows, cols) = im2col::im2col_shape(g);
        let grp = g.groups() - 1;
        let mut col = vec![0f32; rows * cols];
        im2col::im2col(g, grp, &x, &mut col).unwrap();
        cases.push((*g, x, col, rows, cols, grp));
    }
    let mut work = Vec::new();
    for (i, (_, _, _, rows, cols, _)) in cases.iter().enumerate() {
        for blk in blocks(*rows, *cols, kc, panels * nr) {
            work.push((i, false, blk));
        }
        // The transposed packer's matrix is im2col(x)ᵀ.
        for blk in blocks(*cols, *rows, kc, panels * nr) {
            work.push((i, true, blk));
        }
    }
    let mut state = order | 1;
    for i in (1..work.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        work.swap(i, (state % (i as u64 + 1)) as usize);
    }
    for (i, transposed, blk) in work {
        let (g, x, col, _, cols, grp) = &cases[i];
        if transposed {
            let b = Im2colTB::new(g, *grp, x);
            check_block(&b, &|p, j| col[j * cols + p], blk, nr)?;
        } else {
            let b = Im2colB::new(g, *grp, x);
            check_block(&b, &|p, j| col[p * cols + j], blk, nr)?;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn packers_match_im2col_block_by_block(
        g1 in common::geometry(3),
        g2 in common::geometry(2),
        nr in prop::sample::select(vec![4usize, 6, 8, 16, 32, 48]),
        kc in 1usize..=40,
        panels in 1usize..=5,
        order in any::<u64>(),
    ) {
        check_geometries(&[g1, g2], nr, kc, panels, order)?;
    }

    /// The fused packing's panel descriptions ([`PackB::conv_panel`]) against im2col.
    #[test]
    fn conv_panels_match_im2col(
        g1 in common::geometry(3),
        g2 in common::geometry(2),
        kc in 1usize..=40,
    ) {
        check_conv_geometries(&[g1, g2], kc)?;
    }
}

/// Lines of 16 and more outputs (the random geometries stay narrower): whole panel rows read
/// from one input run, with and without padding, stride 1 and 2, 1-D to 3-D.
#[test]
fn wide_lines_pack_block_by_block() {
    let geoms = [
        ConvGeometry::new(3, 5, 4, &[19, 37], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(2, 3, 8, &[9, 16], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(2, 4, 4, &[7, 40], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(2, 2, 3, &[70], &[5]).unwrap(),
        // Lines wider than AVX-512's 32-wide panels, stride 2 (the fixed-width copies of
        // whole panel rows, every other value of 64).
        ConvGeometry::new(2, 3, 4, &[5, 75], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        // Lines wider than 48-wide panels (an 8×48 tile), stride 1 and 2 (every other value
        // of 96).
        ConvGeometry::new(2, 3, 2, &[4, 53], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(1, 2, 3, &[3, 101], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(1, 2, 2, &[3, 4, 33], &[2, 3, 3])
            .unwrap()
            .with_padding(&[0, 1, 2])
            .unwrap()
            .with_groups(2)
            .unwrap(),
    ];
    for (nr, kc, panels) in [
        (16, 144, 1),
        (16, 20, 3),
        (8, 9, 2),
        (32, 50, 1),
        (32, 27, 3),
        (16, 7, 40),
        (32, 7, 20),
        (48, 27, 2),
        (48, 40, 1),
        (48, 7, 12),
    ] {
        check_geometries(&geoms, nr, kc, panels, (nr * kc * panels) as u64).unwrap();
    }
    // The fused packing's descriptions on the same wide lines (stride 1 only are described).
    let mut described = 0;
    for kc in [7, 27, 144] {
        described += check_conv_geometries(&geoms, kc).unwrap();
    }
    assert!(described > 0, "no panel described");
}

/// Channel planes a multiple of 4 KiB apart (1024 floats): `Im2colB` packs such blocks in
/// blocks of channels, tap by tap within each (more than 8 channels per block of B; block
/// rows starting and ending inside a channel's taps included).
#[test]
fn aliasing_planes_pack_block_by_block() {
    let geoms = [
        ConvGeometry::new(2, 20, 3, &[16, 64], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(1, 2 * 12, 4, &[32, 32], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(2)
            .unwrap(),
        ConvGeometry::new(1, 17, 2, &[4, 4, 64], &[3, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
    ];
    for (nr, kc, panels) in [
        (16, 180, 1),
        (48, 180, 2),
        (32, 100, 3),
        (48, 153, 1),
        (16, 500, 2),
        (48, 77, 4),
    ] {
        check_geometries(&geoms, nr, kc, panels, (nr * kc * panels) as u64).unwrap();
    }
}
