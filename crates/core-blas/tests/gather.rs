//! `gather_pieces` against the definition `dst[row * ld + col + t] = src[at + t * stride]`, for
//! every kernel family the host has: piece lengths 0-20 around the 8-wide vector steps, strides
//! 1-3, pieces ending at the last value of `src` (the vector path must not read past it),
//! untouched values between pieces, and the argument errors.

mod common;

use common::random;
use core_blas::{Error, Gemm, Piece};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SENTINEL: f32 = -7.25;

#[test]
fn gather_matches_definition() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        for stride in 1..=3usize {
            for seed in 0..40u64 {
                let mut rng = SmallRng::seed_from_u64(seed * 10 + stride as u64);
                let src = random(rng.random_range(1..300), seed);
                let (rows, ld) = (rng.random_range(1..8usize), rng.random_range(20..40usize));
                let mut pieces = Vec::new();
                let mut used = vec![false; rows * ld];
                for _ in 0..rng.random_range(0..12) {
                    let len = rng.random_range(0..=20usize);
                    let row = rng.random_range(0..rows);
                    let col = rng.random_range(0..=ld - len.min(ld));
                    let span = if len == 0 { 1 } else { (len - 1) * stride + 1 };
                    if span > src.len() {
                        continue;
                    }
                    // Every other piece ends exactly at the end of src.
                    let at = if rng.random_bool(0.5) {
                        src.len() - span
                    } else {
                        rng.random_range(0..=src.len() - span)
                    };
                    let cells = row * ld + col..row * ld + col + len;
                    if cells.clone().any(|i| used[i]) {
                        continue;
                    }
                    cells.for_each(|i| used[i] = true);
                    pieces.push(Piece {
                        row: row as u32,
                        col: col as u32,
                        at,
                        len: len as u32,
                    });
                }
                let mut dst = vec![SENTINEL; rows * ld + 3];
                g.gather_pieces(&mut dst, ld, &src, &pieces, stride)
                    .unwrap();
                let mut want = vec![SENTINEL; rows * ld + 3];
                for p in &pieces {
                    for t in 0..p.len as usize {
                        want[p.row as usize * ld + p.col as usize + t] = src[p.at + t * stride];
                    }
                }
                for (i, (&got, &w)) in dst.iter().zip(&want).enumerate() {
                    assert_eq!(
                        got.to_bits(),
                        w.to_bits(),
                        "{isa:?} stride={stride} seed={seed}: dst[{i}] (pieces {pieces:?})"
                    );
                }
            }
        }
    }
}

#[test]
fn gather_rejects_bad_pieces_before_writing() {
    let g = Gemm::global().unwrap();
    let src = [1.0f32; 20];
    let mut dst = [0.0f32; 32];
    let ok = Piece {
        row: 0,
        col: 0,
        at: 0,
        len: 4,
    };
    let check = |pieces: &[Piece], stride: usize, dst: &mut [f32]| {
        let r = g.gather_pieces(dst, 8, &src, pieces, stride);
        assert!(dst.iter().all(|&v| v == 0.0), "nothing written on error");
        r
    };
    // Past the end of src: at + (len - 1) * 2 + 1 = 21 > 20.
    let far = Piece {
        at: 6,
        len: 8,
        ..ok
    };
    assert!(matches!(
        check(&[ok, far], 2, &mut dst),
        Err(Error::SliceTooShort { arg: "src", .. })
    ));
    // Wider than its row: col + len = 10 > ld = 8.
    let wide = Piece { col: 6, ..ok };
    assert!(matches!(
        check(&[ok, wide], 1, &mut dst),
        Err(Error::LeadingDimension { arg: "ld", .. })
    ));
    // Past the end of dst: row 4 of 8 columns needs 36 > 32.
    let low = Piece { row: 4, ..ok };
    assert!(matches!(
        check(&[ok, low], 1, &mut dst),
        Err(Error::SliceTooShort { arg: "dst", .. })
    ));
    assert!(matches!(
        check(&[ok], 0, &mut dst),
        Err(Error::Stride { arg: "stride", .. })
    ));
    // Empty and one-value pieces need no stride; the free function uses the global family.
    let one = Piece {
        len: 1,
        at: 19,
        ..ok
    };
    core_blas::gather_pieces(&mut dst, 8, &src, &[one, Piece::default()], 0).unwrap();
    assert_eq!(dst[0], 1.0);
}
