//! An append-only file of receipts, one JSON object per line. An append returns only after
//! `fsync`, so an acknowledged receipt survives a crash; a line torn by a crash mid-append was
//! never acknowledged and is cut off when the log is next opened.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::model::Receipt;

/// Longest line (one receipt); metadata alone is bounded to 64 KiB canonical.
pub const MAX_RECEIPT_LINE_BYTES: usize = 256 * 1024;
/// Receipts written with one fsync.
pub const MAX_BATCH: usize = 1_024;

#[derive(Debug, thiserror::Error)]
pub enum ReceiptLogError {
    #[error("receipt log {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("receipt log {path}, line {line}: longer than {MAX_RECEIPT_LINE_BYTES} bytes")]
    LineTooLong { path: PathBuf, line: usize },
    #[error("receipt log {path}, line {line}: {detail}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        detail: String,
    },
    #[error("receipt {receipt_id} encodes to {bytes} bytes; at most {MAX_RECEIPT_LINE_BYTES}")]
    ReceiptTooLarge { receipt_id: String, bytes: usize },
    #[error("batch of {0} receipts; at most {MAX_BATCH}")]
    BatchTooLarge(usize),
    #[error("encode receipt: {0}")]
    Encode(String),
}

pub struct ReceiptLog {
    path: PathBuf,
    file: Mutex<File>,
}

/// What [`read_receipts`] found.
#[derive(Debug, Default)]
pub struct ReadReceipts {
    pub receipts: Vec<Receipt>,
    /// The file ended in a partial line (a crash mid-append); it was skipped.
    pub torn_tail: bool,
}

impl ReceiptLog {
    /// Opens (creating if needed) the log at `path`, cutting off a torn last line.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ReceiptLogError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| ReceiptLogError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(io)?;
        let keep = complete_prefix_len(&mut file).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if keep < len {
            file.set_len(keep).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        Ok(Self {
            path,
            file: Mutex::new(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one receipt and fsyncs before returning.
    pub fn append(&self, receipt: &Receipt) -> Result<(), ReceiptLogError> {
        self.append_batch(std::slice::from_ref(receipt))
    }

    /// Appends `receipts` with one write and one fsync (group commit for busy kernels).
    pub fn append_batch(&self, receipts: &[Receipt]) -> Result<(), ReceiptLogError> {
        if receipts.len() > MAX_BATCH {
            return Err(ReceiptLogError::BatchTooLarge(receipts.len()));
        }
        let mut bytes = Vec::new();
        for receipt in receipts {
            let line =
                serde_json::to_vec(receipt).map_err(|e| ReceiptLogError::Encode(e.to_string()))?;
            if line.len() >= MAX_RECEIPT_LINE_BYTES {
                return Err(ReceiptLogError::ReceiptTooLarge {
                    receipt_id: receipt.receipt_id.clone(),
                    bytes: line.len(),
                });
            }
            bytes.extend_from_slice(&line);
            bytes.push(b'\n');
        }
        let io = |source| ReceiptLogError::Io {
            path: self.path.clone(),
            source,
        };
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        file.write_all(&bytes).map_err(io)?;
        file.sync_data().map_err(io)
    }
}

/// Length of the file up to and including its last newline. Lines are bounded, so only the
/// last `MAX_RECEIPT_LINE_BYTES + 1` bytes need looking at.
fn complete_prefix_len(file: &mut File) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    let window = len.min(MAX_RECEIPT_LINE_BYTES as u64 + 1);
    let start = len - window;
    file.seek(SeekFrom::Start(start))?;
    let mut tail = Vec::with_capacity(usize::try_from(window).unwrap_or(0));
    Read::by_ref(file).take(window).read_to_end(&mut tail)?;
    Ok(match tail.iter().rposition(|&b| b == b'\n') {
        Some(pos) => start + pos as u64 + 1,
        // No newline in the window: either the whole (short) file is one torn line, or the
        // tail is an over-long line that `read_receipts` will report.
        None if start == 0 => 0,
        None => len,
    })
}

/// Reads every complete receipt in the log at `path`, in append order.
pub fn read_receipts(path: impl AsRef<Path>) -> Result<ReadReceipts, ReceiptLogError> {
    let path = path.as_ref().to_path_buf();
    let io = |source| ReceiptLogError::Io {
        path: path.clone(),
        source,
    };
    let mut reader = BufReader::new(File::open(&path).map_err(io)?);
    let mut out = ReadReceipts::default();
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        let limit = MAX_RECEIPT_LINE_BYTES as u64 + 1;
        let n = reader
            .by_ref()
            .take(limit)
            .read_until(b'\n', &mut line)
            .map_err(io)?;
        if n == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            if n as u64 >= limit {
                return Err(ReceiptLogError::LineTooLong { path, line: number });
            }
            out.torn_tail = true;
            break;
        }
        let receipt = serde_json::from_slice(&line).map_err(|e| ReceiptLogError::Corrupt {
            path: path.clone(),
            line: number,
            detail: e.to_string(),
        })?;
        out.receipts.push(receipt);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::keys::KeyPair;
    use crate::receipt::{verify_receipt, ReceiptDraft, Verdict};
    use crate::token::TrustList;

    fn receipt(request: &str) -> Receipt {
        ReceiptDraft::new(request, "cost-srv", "compute", Verdict::Allow, 7)
            .with_metadata(json!({"financial": {"payment_reference": request}}))
            .sign(&KeyPair::from_seed(&[8; 32]))
            .expect("sign")
    }

    #[test]
    fn append_and_read_back_verifiable_receipts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("receipts.jsonl");
        let log = ReceiptLog::open(&path).expect("open");
        let first = receipt("req-1");
        log.append(&first).expect("append");
        let batch = vec![receipt("req-2"), receipt("req-3")];
        log.append_batch(&batch).expect("batch");
        drop(log);
        let read = read_receipts(&path).expect("read");
        assert!(!read.torn_tail);
        assert_eq!(read.receipts.len(), 3);
        assert_eq!(read.receipts[0], first);
        assert_eq!(&read.receipts[1..], &batch[..]);
        let trusted = TrustList::new([KeyPair::from_seed(&[8; 32]).public_key()]);
        for r in &read.receipts {
            assert_eq!(verify_receipt(r, &trusted), Ok(()));
        }
    }

    #[test]
    fn a_torn_tail_is_skipped_then_cut_on_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("receipts.jsonl");
        let log = ReceiptLog::open(&path).expect("open");
        log.append(&receipt("req-1")).expect("append");
        drop(log);
        let mut file = OpenOptions::new().append(true).open(&path).expect("reopen");
        file.write_all(b"{\"receipt_id\":\"half")
            .expect("torn write");
        drop(file);
        let read = read_receipts(&path).expect("read");
        assert!(read.torn_tail);
        assert_eq!(read.receipts.len(), 1);
        let log = ReceiptLog::open(&path).expect("reopen cuts the torn line");
        log.append(&receipt("req-2")).expect("append");
        let read = read_receipts(&path).expect("read");
        assert!(!read.torn_tail);
        assert_eq!(read.receipts.len(), 2);
        assert_eq!(read.receipts[1].request_id, "req-2");
    }

    #[test]
    fn corrupt_and_oversized_lines_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("receipts.jsonl");
        std::fs::write(&path, b"not json\n").expect("write");
        assert!(matches!(
            read_receipts(&path),
            Err(ReceiptLogError::Corrupt { line: 1, .. })
        ));
        let mut long = vec![b'x'; MAX_RECEIPT_LINE_BYTES + 10];
        long.push(b'\n');
        std::fs::write(&path, &long).expect("write");
        assert!(matches!(
            read_receipts(&path),
            Err(ReceiptLogError::LineTooLong { line: 1, .. })
        ));
        let log = ReceiptLog::open(dir.path().join("other.jsonl")).expect("open");
        let too_many = vec![receipt("r"); MAX_BATCH + 1];
        assert!(matches!(
            log.append_batch(&too_many),
            Err(ReceiptLogError::BatchTooLarge(_))
        ));
    }
}
