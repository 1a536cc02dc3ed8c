//! The physical reference: how many sequential `fdatasync`s per second this disk does.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Appends 512 bytes and `fdatasync`s, one after another, for `duration`, timing each:
/// (syncs per second, p50 and p99 of one append + `fdatasync`, in milliseconds).
pub fn fdatasync_profile(dir: &Path, duration: Duration) -> std::io::Result<(f64, f64, f64)> {
    let path = dir.join("fdatasync-profile-probe");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    let block = [0u8; 512];
    let mut micros = Vec::new();
    let start = Instant::now();
    while start.elapsed() < duration {
        let began = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        micros.push(began.elapsed().as_micros() as u64);
    }
    let rate = micros.len() as f64 / start.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;
    micros.sort_unstable();
    let at = |q: f64| {
        let index = ((micros.len() as f64 * q) as usize).min(micros.len().saturating_sub(1));
        micros.get(index).copied().unwrap_or(0) as f64 / 1_000.0
    };
    Ok((rate, at(0.5), at(0.99)))
}
