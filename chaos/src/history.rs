//! The recorded history: every client operation as invoke → ok / fail / info (unknown), with
//! its event id, command and answer, and how each unknown was resolved at the end. The
//! checker reads only this and the replicas' final states.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tally_client::Outcome;
use tally_ledger::{ClientCommand, Decision};

/// Operations kept per run; beyond it the workload stops issuing new ones.
pub const MAX_OPS: usize = 500_000;

/// What one client call came to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpResult {
    /// A decision reached the client (denials included).
    Ok { decision: Decision },
    /// Definite: this call did not apply (refused, unavailable before proposing, or
    /// tombstoned). Only `tombstoned` says the event id can never be in the state: a refusal
    /// may be a replay's answer to a command that applied earlier.
    Fail { reason: String, tombstoned: bool },
    /// Unknown: it may still apply. Must be resolved before the checks.
    Info { reason: String },
}

impl OpResult {
    pub fn from_outcome(outcome: &Outcome) -> Self {
        match outcome {
            Outcome::Decided(decision) => Self::Ok {
                decision: decision.clone(),
            },
            Outcome::Refused(error) => Self::Fail {
                reason: format!("refused: {error}"),
                tombstoned: false,
            },
            Outcome::Unavailable { reason } => Self::Fail {
                reason: format!("unavailable: {reason}"),
                tombstoned: false,
            },
            Outcome::NotApplied { .. } => Self::Fail {
                reason: "not applied (tombstoned)".to_owned(),
                tombstoned: true,
            },
            Outcome::Unknown { reason, .. } => Self::Info {
                reason: reason.clone(),
            },
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            Self::Ok { .. } => "ok",
            Self::Fail { .. } => "fail",
            Self::Info { .. } => "info",
        }
    }
}

/// One completed client call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Op {
    pub index: u64,
    /// Which client instance (worker) issued it.
    pub process: u32,
    pub event_id: String,
    pub family: String,
    /// `Operation::name()`.
    pub kind: &'static str,
    pub command: ClientCommand,
    /// Milliseconds since the run started.
    pub invoked_ms: u64,
    pub completed_ms: u64,
    pub result: OpResult,
}

impl Op {
    /// The call's outcome is unknown: the liveness phase must settle it.
    pub fn is_unknown(&self) -> bool {
        matches!(self.result, OpResult::Info { .. })
    }

    /// How this unknown call was settled.
    pub fn settled(&self, settlement: Settlement) -> Resolution {
        Resolution {
            op_index: self.index,
            event_id: self.event_id.clone(),
            family: self.family.clone(),
            settlement,
        }
    }
}

/// How an unknown was settled in the liveness phase (through `ResolveEvent`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Settlement {
    Applied {
        decision: Decision,
    },
    NotApplied,
    /// A resolve that was itself refused (a conflict): definite, not applied under that id.
    Refused {
        reason: String,
    },
    /// Still no quorum: a liveness failure the checker reports.
    Unresolved {
        reason: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Resolution {
    pub op_index: u64,
    pub event_id: String,
    pub family: String,
    pub settlement: Settlement,
}

impl Settlement {
    pub fn from_outcome(outcome: &Outcome) -> Self {
        match outcome {
            Outcome::Decided(decision) => Self::Applied {
                decision: decision.clone(),
            },
            Outcome::NotApplied { .. } => Self::NotApplied,
            Outcome::Refused(error) => Self::Refused {
                reason: error.to_string(),
            },
            Outcome::Unavailable { reason } | Outcome::Unknown { reason, .. } => Self::Unresolved {
                reason: reason.clone(),
            },
        }
    }
}

/// The shared, bounded recorder every worker writes to.
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl Recorder {
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            ops: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn is_full(&self) -> bool {
        self.lock().len() >= MAX_OPS
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Op>> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a completed call; returns its index (or `None` when the history is full).
    pub fn record(
        &self,
        process: u32,
        command: &ClientCommand,
        invoked_ms: u64,
        outcome: &Outcome,
    ) -> Option<u64> {
        let completed_ms = self.now_ms();
        let mut ops = self.lock();
        if ops.len() >= MAX_OPS {
            return None;
        }
        let index = ops.len() as u64;
        ops.push(Op {
            index,
            process,
            event_id: command.header.event_id.to_string(),
            family: command.header.family_id.to_string(),
            kind: command.op.name(),
            command: command.clone(),
            invoked_ms,
            completed_ms,
            result: OpResult::from_outcome(outcome),
        });
        Some(index)
    }

    pub fn snapshot(&self) -> Vec<Op> {
        self.lock().clone()
    }
}
