//! Rows out of memory on their way to disk. A round hands its rows over in memory; they are
//! written a few MiB at a time, as one sorted run (`cold_runs.rs`), on a thread of their
//! own, so the apply path never waits on the disk and every run is large and in key order.
//!
//! Until its run is written a row is read from memory: every view of the store
//! (`StoreView`) holds the rows not yet on disk at the moment it was taken, so lookups,
//! reads and snapshot cuts see every row handed over before them.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use super::error::RouterError;

/// Rows gathered in memory before they go to disk as one run.
pub(super) const FLUSH_BYTES: usize = 4 << 20;

pub(super) type Rows = BTreeMap<Vec<u8>, Vec<u8>>;

/// The rows not yet in the file: those being written (`flushing`) and those gathering for
/// the next write (`active`). Each is shared with the views taken while it was current.
#[derive(Default)]
pub(super) struct ColdBuffer {
    state: Mutex<BufferState>,
    flushed: Condvar,
}

#[derive(Default)]
struct BufferState {
    active: Arc<Rows>,
    active_bytes: usize,
    flushing: Option<Arc<Rows>>,
    flushing_bytes: usize,
    /// A write to the file that failed: the store is broken from then on (fatal).
    failed: Option<String>,
}

/// What `ColdBuffer::add` asks of its caller.
pub(super) enum Added {
    /// The rows are held in memory; nothing more to do.
    Held,
    /// The buffer is full: write these rows to disk, then call `flushed`.
    Flush(Arc<Rows>),
    /// The buffer is full while an earlier write is under way: call `flush_when_free`
    /// (which blocks) before handing more rows over.
    Full,
}

/// What a view holds of the buffer: the rows not yet in the file when it was taken.
#[derive(Clone, Default)]
pub(super) struct BufferedRows(Vec<Arc<Rows>>);

impl BufferedRows {
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.0
            .iter()
            .find_map(|rows| rows.get(key))
            .map(Vec::as_slice)
    }

    /// The rows with keys in `start..end`, in key order.
    pub fn range(&self, start: &[u8], end: &[u8]) -> Vec<(&[u8], &[u8])> {
        sorted((self.0.iter()).flat_map(|rows| rows.range(start.to_vec()..end.to_vec())))
    }

    /// Every row, in key order.
    pub fn all(&self) -> Vec<(&[u8], &[u8])> {
        sorted(self.0.iter().flat_map(|rows| rows.iter()))
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|rows| rows.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|rows| rows.is_empty())
    }
}

/// Rows of several maps (whose keys are distinct across them) in one key order.
fn sorted<'a>(rows: impl Iterator<Item = (&'a Vec<u8>, &'a Vec<u8>)>) -> Vec<(&'a [u8], &'a [u8])> {
    let mut rows: Vec<(&[u8], &[u8])> = rows
        .map(|(key, row)| (key.as_slice(), row.as_slice()))
        .collect();
    rows.sort_unstable_by(|a, b| a.0.cmp(b.0));
    rows
}

impl ColdBuffer {
    fn lock(&self) -> MutexGuard<'_, BufferState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds rows, never waiting, and says what the caller does next (`Added`). While an
    /// earlier write is under way and the buffer is full again, the caller waits in
    /// `flush_when_free`: the disk keeps up, or apply slows to its pace.
    pub fn add(&self, rows: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Added, RouterError> {
        let mut state = self.lock();
        check(&state)?;
        let active = Arc::make_mut(&mut state.active);
        let mut added = 0;
        for (key, row) in rows {
            added += key.len() + row.len();
            if active.insert(key, row).is_some() {
                return Err(RouterError::Store(
                    "a row out of memory was handed over twice".into(),
                ));
            }
        }
        state.active_bytes += added;
        Ok(if state.active_bytes < FLUSH_BYTES {
            Added::Held
        } else if state.flushing.is_some() {
            Added::Full
        } else {
            Added::Flush(self.start_flush(&mut state))
        })
    }

    /// After `Added::Full`: waits until the earlier write is done, then returns the rows to
    /// write now (the caller writes them, then calls `flushed`). Blocking.
    pub fn flush_when_free(&self) -> Result<Option<Arc<Rows>>, RouterError> {
        let mut state = self.wait_for_flush(self.lock());
        check(&state)?;
        if state.active_bytes < FLUSH_BYTES {
            return Ok(None);
        }
        Ok(Some(self.start_flush(&mut state)))
    }

    /// The lock again once no write to the file is under way.
    fn wait_for_flush<'a>(
        &'a self,
        mut state: MutexGuard<'a, BufferState>,
    ) -> MutexGuard<'a, BufferState> {
        while state.flushing.is_some() {
            state = self
                .flushed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state
    }

    /// Everything buffered, to write now (a restore's end, tests).
    pub fn take_all(&self) -> Result<Option<Arc<Rows>>, RouterError> {
        let mut state = self.wait_for_flush(self.lock());
        check(&state)?;
        if state.active.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.start_flush(&mut state)))
    }

    fn start_flush(&self, state: &mut BufferState) -> Arc<Rows> {
        let rows = std::mem::take(&mut state.active);
        state.flushing_bytes = std::mem::take(&mut state.active_bytes);
        state.flushing = Some(Arc::clone(&rows));
        rows
    }

    /// After the write of the rows `add` or `take_all` returned: they are read from disk from
    /// now on. `after_commit` runs under the buffer's lock (it adds the run written, so no
    /// view can hold neither the rows in memory nor the run that holds them).
    pub fn flushed<T>(&self, result: Result<T, RouterError>, after_commit: impl FnOnce(T)) {
        let mut state = self.lock();
        match result {
            Ok(written) => after_commit(written),
            Err(error) => state.failed = Some(error.to_string()),
        }
        state.flushing = None;
        state.flushing_bytes = 0;
        self.flushed.notify_all();
    }

    /// The rows not yet in the file, for a view; `with_view` makes the file's part of it
    /// under the same lock (see `flushed`).
    pub fn snapshot<T>(
        &self,
        with_view: impl FnOnce() -> Result<T, RouterError>,
    ) -> Result<(BufferedRows, T), RouterError> {
        let state = self.lock();
        check(&state)?;
        let mut rows = vec![Arc::clone(&state.active)];
        rows.extend(state.flushing.clone());
        Ok((BufferedRows(rows), with_view()?))
    }

    /// Bytes of rows held in memory now.
    pub fn bytes(&self) -> usize {
        let state = self.lock();
        state.active_bytes + state.flushing_bytes
    }
}

fn check(state: &BufferState) -> Result<(), RouterError> {
    match &state.failed {
        Some(reason) => Err(RouterError::Store(format!(
            "an earlier write of rows out of memory failed: {reason}"
        ))),
        None => Ok(()),
    }
}
