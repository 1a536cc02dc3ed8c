//! The rows out of memory as one moment saw them: those still in the buffer and the runs on
//! disk (`cold_buffer.rs`, `cold_runs.rs`). A store view reads rows through it; a node's own
//! snapshot links its runs instead of copying their rows, and a snapshot sent to another node
//! reads them back from the snapshot's links through it.
//!
//! Every method blocks on disk I/O.

use std::path::Path;
use std::sync::Arc;

use tally_ledger::FamilyId;

use super::cold_buffer::BufferedRows;
use super::cold_keys::cold_family_prefix;
use super::cold_runs::{merge_sorted, ColdRuns, RowSource, Run};
use super::error::store_error;
use super::error::RouterError;

/// Rows out of memory at one moment: later hand-overs and merges do not change them.
#[derive(Clone, Default)]
pub(super) struct ColdView {
    pub(super) buffered: BufferedRows,
    /// The runs on disk at that moment, oldest first.
    pub(super) runs: Vec<Arc<Run>>,
}

impl ColdView {
    /// The rows of `runs` alone (a snapshot's links, opened).
    pub fn of_runs(runs: Vec<Arc<Run>>) -> Self {
        Self {
            buffered: BufferedRows::default(),
            runs,
        }
    }

    /// Rows in all, buffered and on disk.
    pub fn rows(&self) -> u64 {
        self.buffered.len() as u64 + self.runs.iter().map(|run| run.rows()).sum::<u64>()
    }

    /// The row under `key` (`cold_row_key`), if any, and whether it was read from disk.
    pub fn cold_row(&self, key: &[u8]) -> Result<(Option<Vec<u8>>, bool), RouterError> {
        if let Some(row) = self.buffered.get(key) {
            return Ok((Some(row.to_vec()), false));
        }
        for run in self.runs.iter().rev() {
            if let Some(row) = run.get(key)? {
                return Ok((Some(row), true));
            }
        }
        Ok((None, true))
    }

    /// Every row `family_id` moved out of memory, in key order, as `(key within the family,
    /// row)`, passed to `each`.
    pub fn each_cold_row(
        &self,
        family_id: &FamilyId,
        mut each: impl FnMut(&[u8], &[u8]) -> Result<(), RouterError>,
    ) -> Result<(), RouterError> {
        let prefix = cold_family_prefix(family_id);
        let mut end = prefix.clone();
        // Keys within a family start with a kind byte below 0xff.
        end.push(0xff);
        let mut sources: Vec<RowSource<'_>> = (self.runs.iter())
            .map(|run| Box::new(run.range(&prefix, Some(&end))) as RowSource<'_>)
            .collect();
        let memory = self.buffered.range(&prefix, &end);
        sources.push(Box::new(
            (memory.into_iter()).map(|(key, row)| Ok((key.to_vec(), row.to_vec()))),
        ));
        merge_sorted(sources, |key, row| each(&key[prefix.len()..], row))
    }

    /// Makes every row of the view durable in `dir` (which must exist and be empty) as run
    /// files named `000000.run`, `000001.run`, … in the order returned: each run on disk by
    /// a hard link (synced first: runs are written without fsync), the buffered rows as one
    /// more run. Then syncs `dir`. A snapshot names these files instead of copying the rows,
    /// so writing one costs the rows added since the last, not the whole history.
    pub fn link_into(&self, dir: &Path) -> Result<Vec<String>, RouterError> {
        let mut names = Vec::with_capacity(self.runs.len() + 1);
        let mut link = |run: &Run| -> Result<(), RouterError> {
            let name = format!("{:06}.run", names.len());
            run.link_to(&dir.join(&name))?;
            names.push(name);
            Ok(())
        };
        for run in &self.runs {
            link(run)?;
        }
        if !self.buffered.is_empty() {
            // A few MiB at most: written in memory as one run, then to `dir`.
            let mut writer = ColdRuns::new(None).writer()?;
            for (key, row) in self.buffered.all() {
                writer.push(key, row)?;
            }
            link(&writer.finish()?)?;
        }
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| store_error("sync a snapshot's directory of runs", e))?;
        Ok(names)
    }
}
