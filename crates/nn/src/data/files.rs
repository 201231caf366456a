//! The standard image-classification files: MNIST and Fashion-MNIST (IDX, plain or gzip) and
//! CIFAR-10 (the binary version), read from a directory the user names (`--data-dir`).

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

use super::Dataset;
use crate::error::{NnError, Result};

fn bad(path: &Path, detail: impl Into<String>) -> NnError {
    NnError::DataFile {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| NnError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// `dir/name`, or `dir/name.gz` decompressed, whole.
fn read_maybe_gz(dir: &Path, name: &str) -> Result<(PathBuf, Vec<u8>)> {
    let plain = dir.join(name);
    if plain.is_file() {
        return Ok((plain.clone(), read(&plain)?));
    }
    let gz = dir.join(format!("{name}.gz"));
    if gz.is_file() {
        let mut out = Vec::new();
        GzDecoder::new(read(&gz)?.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| bad(&gz, format!("not a gzip file: {e}")))?;
        return Ok((gz, out));
    }
    Err(bad(&plain, format!("not found (nor {name}.gz)")))
}

/// The dimensions and the payload of an IDX file of unsigned bytes with `rank` dimensions.
fn idx(path: &Path, bytes: &[u8], rank: usize) -> Result<(Vec<usize>, Vec<u8>)> {
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(bad(
            path,
            format!("{} bytes: shorter than an IDX header", bytes.len()),
        ));
    }
    if bytes[..2] != [0, 0] || bytes[2] != 0x08 || bytes[3] as usize != rank {
        return Err(bad(
            path,
            format!(
                "magic {:02x?}: expected an IDX file of bytes with {rank} dimensions (00 00 08 {rank:02x})",
                &bytes[..4]
            ),
        ));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let len: usize = dims.iter().product();
    if bytes.len() != header + len {
        return Err(bad(
            path,
            format!(
                "dimensions {dims:?} need {} bytes, the file has {}",
                header + len,
                bytes.len()
            ),
        ));
    }
    Ok((dims, bytes[header..].to_vec()))
}

/// One split of an MNIST-format data set: `prefix-images-idx3-ubyte` and `prefix-labels-idx1-ubyte`.
fn mnist_split(dir: &Path, prefix: &str) -> Result<Dataset> {
    let (ipath, ibytes) = read_maybe_gz(dir, &format!("{prefix}-images-idx3-ubyte"))?;
    let (lpath, lbytes) = read_maybe_gz(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
    let (idims, pixels) = idx(&ipath, &ibytes, 3)?;
    let (ldims, labels) = idx(&lpath, &lbytes, 1)?;
    if ldims[0] != idims[0] {
        return Err(bad(
            &lpath,
            format!(
                "{} labels for {} images in {}",
                ldims[0],
                idims[0],
                ipath.display()
            ),
        ));
    }
    if let Some((i, l)) = labels.iter().enumerate().find(|(_, l)| **l >= 10) {
        return Err(bad(
            &lpath,
            format!("label {l} of sample {i} is not a digit class (0-9)"),
        ));
    }
    let inputs = pixels.iter().map(|&p| p as f32 / 255.0).collect();
    let labels = labels.iter().map(|&l| l as usize).collect();
    Dataset::new(&[1, idims[1], idims[2]], inputs, labels, 10)
}

/// CIFAR-10 records (`label, 3072 pixels`) of one `.bin` file, appended.
fn cifar_file(path: &Path, inputs: &mut Vec<f32>, labels: &mut Vec<usize>) -> Result<()> {
    const RECORD: usize = 1 + 3 * 32 * 32;
    let bytes = read(path)?;
    if bytes.is_empty() || bytes.len() % RECORD != 0 {
        return Err(bad(
            path,
            format!(
                "{} bytes is not a whole number of {RECORD}-byte records",
                bytes.len()
            ),
        ));
    }
    for (i, rec) in bytes.chunks_exact(RECORD).enumerate() {
        if rec[0] >= 10 {
            return Err(bad(
                path,
                format!("record {i} has label {} (classes 0-9)", rec[0]),
            ));
        }
        labels.push(rec[0] as usize);
        inputs.extend(rec[1..].iter().map(|&p| p as f32 / 255.0));
    }
    Ok(())
}

impl Dataset {
    /// MNIST or Fashion-MNIST (the same format) from `dir`: `(train, test)` with 60,000 and
    /// 10,000 samples of 1×28×28 in the original files, pixels scaled to 0..1, ten classes.
    ///
    /// `dir` holds `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`
    /// and `t10k-labels-idx1-ubyte`, each plain or gzip-compressed (`.gz`, as distributed).
    pub fn mnist(dir: &Path) -> Result<(Dataset, Dataset)> {
        Ok((mnist_split(dir, "train")?, mnist_split(dir, "t10k")?))
    }

    /// CIFAR-10, binary version, from `dir` or `dir/cifar-10-batches-bin`: `(train, test)` from
    /// `data_batch_1.bin`..`data_batch_5.bin` and `test_batch.bin`, samples of 3×32×32 with
    /// pixels scaled to 0..1, ten classes.
    pub fn cifar10(dir: &Path) -> Result<(Dataset, Dataset)> {
        let nested = dir.join("cifar-10-batches-bin");
        let dir = if nested.is_dir() {
            nested
        } else {
            dir.to_path_buf()
        };
        let split = |files: &[String]| -> Result<Dataset> {
            let (mut inputs, mut labels) = (Vec::new(), Vec::new());
            for f in files {
                let path = dir.join(f);
                if !path.is_file() {
                    return Err(bad(&path, "not found"));
                }
                cifar_file(&path, &mut inputs, &mut labels)?;
            }
            Dataset::new(&[3, 32, 32], inputs, labels, 10)
        };
        let train: Vec<String> = (1..=5).map(|i| format!("data_batch_{i}.bin")).collect();
        Ok((split(&train)?, split(&["test_batch.bin".to_string()])?))
    }
}
