//! Offline search for the interpolation points of F(m, r) that minimise the measured f32 error.
//!
//! `cargo run --release -p fastconv --example point_search [max_alpha [min_alpha [r]]]` prints, for m in 2..=8,
//! r in 2..=7 with α ≤ max_alpha (default 12), the chosen points and errors as Rust source for
//! `fastconv::points::TABLE` and as a Markdown table for `docs/ALGORITHMS.md`, together with the
//! errors of the usual sequence 0, ±1, ±2, ±1/2, ±3, … for comparison.

use fastconv::points::{TABLE_SEED, TABLE_TRIALS, search};
use fastconv::{Point, WinogradTransform, measure_error};

fn fmt_point(&(n, d): &(i64, i64)) -> String {
    if d == 1 {
        format!("{n}")
    } else {
        format!("{n}/{d}")
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let max_alpha: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(12);
    let min_alpha: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1);
    let only_r: Option<usize> = std::env::args().nth(3).map(|s| s.parse()).transpose()?;
    let usual = [
        (0, 1),
        (1, 1),
        (-1, 1),
        (2, 1),
        (-2, 1),
        (1, 2),
        (-1, 2),
        (3, 1),
        (-3, 1),
        (1, 3),
        (-1, 3),
        (4, 1),
    ];
    let mut rust = String::new();
    let mut md = String::from(
        "| F(m, r) | α | points (plus ∞) | 1-D error | 2-D error | 2-D error, usual points |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for r in 2..=7usize {
        for m in 2..=8usize {
            let alpha = m + r - 1;
            if alpha > max_alpha || alpha < min_alpha || only_r.is_some_and(|o| o != r) {
                continue;
            }
            let start = std::time::Instant::now();
            let res = search(m, r, 200, 12)?;
            let mut up: Vec<Point> = usual[..alpha - 1]
                .iter()
                .map(|&(n, d)| Point::ratio(n, d))
                .collect::<Result<_, _>>()?;
            up.push(Point::Infinity);
            let tu = WinogradTransform::synthesize(m, r, &up)?;
            let eu = measure_error(&[tu.clone(), tu], TABLE_TRIALS, TABLE_SEED)?;
            let pts: Vec<String> = res.finite_points.iter().map(fmt_point).collect();
            eprintln!(
                "F({m},{r}) α={alpha}: {} candidates in {:.1}s -> [{}] 1d {:.2e} 2d {:.2e} (usual 2d {:.2e})",
                res.candidates,
                start.elapsed().as_secs_f64(),
                pts.join(", "),
                res.err_1d.max_rel,
                res.err_2d.max_rel,
                eu.max_rel
            );
            let tuples: Vec<String> = res
                .finite_points
                .iter()
                .map(|(n, d)| format!("({n}, {d})"))
                .collect();
            rust.push_str(&format!(
                "    TableEntry {{ m: {m}, r: {r}, finite_points: &[{}], err_1d: {:.3e}, err_2d: {:.3e} }},\n",
                tuples.join(", "),
                res.err_1d.max_rel,
                res.err_2d.max_rel
            ));
            md.push_str(&format!(
                "| F({m}, {r}) | {alpha} | {} | {:.2e} | {:.2e} | {:.2e} |\n",
                pts.join(", "),
                res.err_1d.max_rel,
                res.err_2d.max_rel,
                eu.max_rel
            ));
        }
    }
    println!("{rust}\n{md}");
    Ok(())
}
