//! A tour of what the framework runs on this machine: the kernel family and threads, the FMA
//! peak, the GEMM against it, then every convolution algorithm of every training pass on a
//! ResNet-50 layer — checked against the naive reference on a small layer first — with time,
//! GFLOP/s and the workspace each needs.
//!
//! `cargo run --release -p examples --bin demo [-- --threads 2 --layer r50_3x3_c128_28]`

use std::time::Duration;

use clap::Parser;
use conv_ops::testing::{Tolerance, uniform};
use conv_ops::{
    BackwardDataAlgo, BackwardFilterAlgo, ConvGeometry, ForwardAlgo, Pass, Workspace,
    backward_data, backward_filter, forward, reference, workspace_bytes,
};
use examples::{human_bytes, median_time, peak_rss_bytes};

/// Demonstrate the kernels and convolution algorithms on this machine.
#[derive(Parser, Debug)]
struct Args {
    /// Threads (rayon pool size); default: all cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Layer: r50_3x3_c64_56, r50_3x3_c128_28, r50_3x3_c256_14, r50_3x3_c512_7, c3d_64_8x28x28.
    #[arg(long, default_value = "r50_3x3_c128_28")]
    layer: String,
    /// Timed runs per case (median reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

const PASSES: [(Pass, &str); 7] = [
    (
        Pass::Forward(ForwardAlgo::Im2colGemm),
        "forward         im2col + GEMM (base)",
    ),
    (
        Pass::Forward(ForwardAlgo::Convgemm),
        "forward         convgemm",
    ),
    (
        Pass::BackwardData(BackwardDataAlgo::GemmCol2im),
        "backward-data   GEMM + col2im (base)",
    ),
    (
        Pass::BackwardData(BackwardDataAlgo::Deconvgemm),
        "backward-data   deconvgemm",
    ),
    (
        Pass::BackwardFilter(BackwardFilterAlgo::Im2colGemmT),
        "backward-filter im2col + GEMMᵀ (base)",
    ),
    (
        Pass::BackwardFilter(BackwardFilterAlgo::ReindexConvgemm),
        "backward-filter Reindex + convgemm",
    ),
    (
        Pass::BackwardFilter(BackwardFilterAlgo::ConvgemmTrans),
        "backward-filter transposed convgemm",
    ),
];

struct Buffers {
    x: Vec<f32>,
    w: Vec<f32>,
    dy: Vec<f32>,
    y: Vec<f32>,
    dx: Vec<f32>,
    dw: Vec<f32>,
}

impl Buffers {
    fn new(g: &ConvGeometry) -> Self {
        Buffers {
            x: uniform(1, g.x_len()),
            w: uniform(2, g.w_len()),
            dy: uniform(3, g.y_len()),
            y: vec![0.0; g.y_len()],
            dx: vec![0.0; g.x_len()],
            dw: vec![0.0; g.w_len()],
        }
    }
    fn run(&mut self, g: &ConvGeometry, pass: Pass, ws: &mut Workspace) -> conv_ops::Result<()> {
        match pass {
            Pass::Forward(a) => forward(g, &self.x, &self.w, None, false, &mut self.y, a, ws),
            Pass::BackwardData(a) => backward_data(g, &self.dy, &self.w, &mut self.dx, a, ws),
            Pass::BackwardFilter(a) => backward_filter(g, &self.x, &self.dy, &mut self.dw, a, ws),
        }
    }
    /// The result of `pass` and the reference's.
    fn result_and_reference(&self, g: &ConvGeometry, pass: Pass) -> (Vec<f32>, Vec<f32>) {
        match pass {
            Pass::Forward(_) => {
                let mut r = vec![0.0; g.y_len()];
                reference::forward(g, &self.x, &self.w, None, &mut r).expect("reference");
                (self.y.clone(), r)
            }
            Pass::BackwardData(_) => {
                let mut r = vec![0.0; g.x_len()];
                reference::backward_data(g, &self.dy, &self.w, &mut r).expect("reference");
                (self.dx.clone(), r)
            }
            Pass::BackwardFilter(_) => {
                let mut r = vec![0.0; g.w_len()];
                reference::backward_filter(g, &self.x, &self.dy, &mut r).expect("reference");
                (self.dw.clone(), r)
            }
        }
    }
}

fn layer(name: &str) -> Result<ConvGeometry, String> {
    let g = match name {
        "r50_3x3_c64_56" => ConvGeometry::new(8, 64, 64, &[56, 56], &[3, 3]),
        "r50_3x3_c128_28" => ConvGeometry::new(8, 128, 128, &[28, 28], &[3, 3]),
        "r50_3x3_c256_14" => ConvGeometry::new(8, 256, 256, &[14, 14], &[3, 3]),
        "r50_3x3_c512_7" => ConvGeometry::new(8, 512, 512, &[7, 7], &[3, 3]),
        "c3d_64_8x28x28" => ConvGeometry::new(1, 64, 64, &[8, 28, 28], &[3, 3, 3]),
        other => return Err(format!("unknown layer `{other}`")),
    };
    g.and_then(|g| g.with_padding(&[1]))
        .map_err(|e| e.to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if let Some(t) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()?;
    }
    let threads = rayon::current_num_threads();
    let gemm = core_blas::Gemm::global()?;
    let (mr, nr) = gemm.tile();
    println!("== machine");
    println!(
        "kernel family   {} ({}, micro-tile {mr}×{nr})",
        gemm.isa().name(),
        gemm.kernel_name()
    );
    println!(
        "available       {:?}",
        core_blas::Isa::available()
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
    );
    println!("threads         {threads}");
    let peak = core_blas::peak::fma_peak_gflops(gemm.isa(), threads, Duration::from_millis(300))?;
    println!("FMA peak        {peak:.1} GFLOP/s (measured now, {threads} thread(s))");

    println!("\n== GEMM (C = A·B, f32, row-major)");
    for &(m, n, k) in &[(1024, 1024, 1024), (256, 3136, 2304), (64, 50176, 576)] {
        let (a, b) = (uniform(4, m * k), uniform(5, k * n));
        let mut c = vec![0f32; m * n];
        let t = median_time(args.runs, || {
            core_blas::sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)
        })?;
        let gf = 2.0 * (m * n * k) as f64 / t.as_secs_f64() / 1e9;
        println!(
            "{m:>5}×{n:<5}×{k:<5} {:>8.2} ms {gf:>7.1} GFLOP/s  {:>4.0}% of peak",
            t.as_secs_f64() * 1e3,
            100.0 * gf / peak
        );
    }

    println!("\n== convolution algorithms, checked against the naive reference");
    let small = ConvGeometry::new(2, 6, 5, &[9, 11], &[3, 3])?
        .with_stride(&[2, 1])?
        .with_padding(&[1])?;
    let mut bufs = Buffers::new(&small);
    for (pass, name) in PASSES {
        let mut ws = Workspace::new(false);
        bufs.run(&small, pass, &mut ws)?;
        let (got, want) = bufs.result_and_reference(&small, pass);
        let verdict = match Tolerance::for_f32_sum(small.batch() * 121).check("result", &got, &want)
        {
            Ok(()) => "matches".to_string(),
            Err(e) => format!("MISMATCH: {e}"),
        };
        println!("{name:<40} {verdict}");
    }

    let g = layer(&args.layer)?;
    let gflop = g.flops() as f64 / 1e9;
    println!(
        "\n== {} (N={} C={} K={} {:?}, kernel {:?}, {gflop:.2} GFLOP per pass)",
        args.layer,
        g.batch(),
        g.in_channels(),
        g.out_channels(),
        g.input(),
        g.kernel()
    );
    println!(
        "{:<40} {:>9} {:>9} {:>7} {:>12}",
        "pass / algorithm", "ms", "GFLOP/s", "% peak", "workspace"
    );
    let mut bufs = Buffers::new(&g);
    for (pass, name) in PASSES {
        let mut ws = Workspace::new(false);
        let t = median_time(args.runs, || bufs.run(&g, pass, &mut ws))?;
        let rate = gflop / t.as_secs_f64();
        println!(
            "{name:<40} {:>9.2} {rate:>9.1} {:>6.0}% {:>12}",
            t.as_secs_f64() * 1e3,
            100.0 * rate / peak,
            human_bytes(workspace_bytes(&g, pass) as u64)
        );
    }
    if let Some(rss) = peak_rss_bytes() {
        println!(
            "\npeak resident memory of this process: {}",
            human_bytes(rss)
        );
    }
    Ok(())
}
