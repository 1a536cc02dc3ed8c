//! The physical reference: how many sequential `fdatasync`s per second this disk does.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Appends 512 bytes and `fdatasync`s, one after another, for `duration`.
pub fn fdatasync_rate(dir: &Path, duration: Duration) -> std::io::Result<f64> {
    let path = dir.join("fdatasync-probe");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    let block = [0u8; 512];
    let start = Instant::now();
    let mut syncs = 0u64;
    while start.elapsed() < duration {
        file.write_all(&block)?;
        file.sync_data()?;
        syncs += 1;
    }
    let rate = syncs as f64 / start.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(rate)
}
