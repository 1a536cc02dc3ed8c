//! A file writer that hands its pages to the disk as it goes, for snapshot files and the
//! family store's runs of rows.
//!
//! A snapshot of a loaded node is gigabytes written in one go and synced at the end (and a
//! merge of runs, or a restore, is gigabytes written in one go and never synced). Left to
//! the kernel, those pages stay dirty until the final `fsync` (or the kernel's own writeback)
//! sends them in one burst, and the Raft log's `fdatasync` on the same disk waits behind it:
//! every replica writes its snapshot at about the same log index, so commits stall cluster
//! wide. Here every `WRITEBACK_STEP_BYTES` the range just written is sent to the disk
//! (`sync_file_range` WRITE, which does not wait) and the range before it waited for, so at
//! most two steps of the file are ever dirty and the final sync has little left to do. This
//! changes when the bytes reach the disk, never what is written or the durability contract:
//! the caller still syncs the whole file before it counts.

use std::fs;
use std::io::{self, Write};

/// Bytes between two writebacks: large enough that the disk sees long sequential writes,
/// small enough that a log `fdatasync` never queues behind much.
const WRITEBACK_STEP_BYTES: u64 = 8 << 20;

pub struct WritebackFile {
    file: fs::File,
    /// Bytes written through this writer (the file is written from offset 0, in order).
    written: u64,
    /// Bytes whose writeback was started.
    started: u64,
    /// Writebacks started, for tests and logs.
    steps: u64,
}

impl WritebackFile {
    /// `file` positioned at offset 0 (a file just created or truncated).
    pub fn new(file: fs::File) -> Self {
        Self {
            file,
            written: 0,
            started: 0,
            steps: 0,
        }
    }

    pub fn into_inner(self) -> fs::File {
        self.file
    }

    /// Writebacks started so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Waits for the previous step to be on disk, then starts the writeback of the bytes
    /// written since.
    fn step(&mut self) -> io::Result<()> {
        let previous_start = self.started.saturating_sub(WRITEBACK_STEP_BYTES);
        wait_written(&self.file, previous_start, self.started - previous_start)?;
        start_writeback(&self.file, self.started, self.written - self.started)?;
        self.started = self.written;
        self.steps += 1;
        Ok(())
    }
}

impl Write for WritebackFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= WRITEBACK_STEP_BYTES {
            self.step()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(target_os = "linux")]
fn sync_file_range(file: &fs::File, offset: u64, len: u64, flags: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(());
    }
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Ok(());
    };
    // SAFETY: the descriptor is open for the lifetime of `file`; the call reads no memory.
    let done = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(target_os = "linux")]
fn start_writeback(file: &fs::File, offset: u64, len: u64) -> io::Result<()> {
    sync_file_range(file, offset, len, libc::SYNC_FILE_RANGE_WRITE)
}

#[cfg(target_os = "linux")]
fn wait_written(file: &fs::File, offset: u64, len: u64) -> io::Result<()> {
    sync_file_range(
        file,
        offset,
        len,
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER,
    )
}

/// Elsewhere the kernel's writeback and the final sync do it all.
#[cfg(not(target_os = "linux"))]
fn start_writeback(_: &fs::File, _: u64, _: u64) -> io::Result<()> {
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn wait_written(_: &fs::File, _: u64, _: u64) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{BufWriter, Read};

    use super::*;

    #[test]
    fn a_long_write_is_handed_to_the_disk_in_steps_and_reads_back_whole() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("snapshot");
        let file = fs::File::create(&path).expect("create");
        let mut out = BufWriter::with_capacity(1 << 20, WritebackFile::new(file));
        let block: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
        let blocks = 20;
        for _ in 0..blocks {
            out.write_all(&block).expect("write");
        }
        let writer = out
            .into_inner()
            .map_err(|e| e.into_error())
            .expect("flushed");
        assert_eq!(
            writer.steps(),
            (blocks << 20) / WRITEBACK_STEP_BYTES,
            "one writeback per {WRITEBACK_STEP_BYTES} bytes"
        );
        writer.into_inner().sync_all().expect("sync");
        let mut back = Vec::new();
        fs::File::open(&path)
            .expect("open")
            .read_to_end(&mut back)
            .expect("read");
        assert_eq!(back.len() as u64, blocks << 20);
        assert!(back.chunks(1 << 20).all(|chunk| chunk == block.as_slice()));
    }
}
