//! The ledger apply harness: commands decoded from untrusted bytes (a Forward payload, a log
//! entry) applied the way the authority's router applies them, on two replicas at once,
//! checking after every command what must hold whatever the commands were:
//!
//! - `Family::apply` never panics, and the docs/spec.md §11 invariants of
//!   `Family::invariant_violations` hold after every command;
//! - both replicas give the same answer and reach byte-identical snapshots (the id tables
//!   hash with a per-table random seed, which must never show in an answer or a byte);
//! - every answer (decision or ledger error) survives the protobuf wire unchanged, as do the
//!   reads a client makes afterwards (usages, holds, events, event lookups);
//! - every family's snapshot bytes decode back to the same family with the same digest.
//!
//! What it does not model: actors, passivation and batching into rounds, which change no
//! answer (the router's own tests cover them).

use std::collections::BTreeMap;

use tally_api::pb;
use tally_ledger::cluster_time::advance;
use tally_ledger::limits::{MAX_COMMANDS_PER_ENTRY, MAX_LIST_LIMIT};
use tally_ledger::{
    ApplyCtx, ClusterParams, ColdRowsInMemory, Command, Decision, EventLookup, Family, FamilyId,
    HoldFilter,
    LedgerError, LogPosition, ParamsChange,
};

use crate::roundtrip::proto;

/// Commands applied per fuzz input at most; more only repeat what fewer already reach, and
/// the invariant check after each command is linear in the family's size.
pub const MAX_COMMANDS_PER_INPUT: usize = 512;

/// One replica's state: the router's scalars and its families.
struct Replica {
    families: BTreeMap<FamilyId, Family>,
    /// Each family's rows out of memory, kept as a node's store would.
    cold: BTreeMap<FamilyId, ColdRowsInMemory>,
}

impl Replica {
    fn apply(&mut self, command: &Command, ctx: &ApplyCtx) -> Result<Decision, LedgerError> {
        // The router answers an invalid family id itself, so garbage ids never get an actor
        // (authority/src/families/batch.rs, `plan`).
        command.family_id().validate()?;
        let family = self
            .families
            .entry(command.family_id().clone())
            .or_insert_with(|| Family::new(command.family_id().clone()));
        let cold = self.cold.entry(command.family_id().clone()).or_default();
        let result = cold.apply(family, command, ctx);
        let violations = family.invariant_violations();
        assert!(
            violations.is_empty(),
            "invariants broken after {command:?} at {ctx:?} -> {result:?}: {violations:#?}"
        );
        result
    }
}

/// Two replicas fed the same log.
pub struct Harness {
    replicas: [Replica; 2],
    last_applied: Option<LogPosition>,
    cluster_time_ms: u64,
    params: ClusterParams,
    commands_applied: usize,
    event_ids: Vec<tally_ledger::EventId>,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Self {
            replicas: [
                Replica {
                    families: BTreeMap::new(),
                    cold: BTreeMap::new(),
                },
                Replica {
                    families: BTreeMap::new(),
                    cold: BTreeMap::new(),
                },
            ],
            last_applied: None,
            cluster_time_ms: 0,
            params: ClusterParams::default(),
            commands_applied: 0,
            event_ids: Vec::new(),
        }
    }

    pub fn params(&self) -> ClusterParams {
        self.params
    }

    /// The next log position (term 1, indexes from 1).
    pub fn next_log_id(&self) -> LogPosition {
        LogPosition {
            term: 1,
            index: self.last_applied.map_or(1, |id| id.index + 1),
        }
    }

    /// One entry as `RouterState::enter` takes it: the clock advances from the stamp with the
    /// parameters in force before the entry, then a parameter change applies. Returns the
    /// cluster time its commands apply at.
    pub fn enter(&mut self, stamped_ms: u64, change: Option<&ParamsChange>) -> (LogPosition, u64) {
        let log_id = self.next_log_id();
        self.last_applied = Some(log_id);
        self.cluster_time_ms = advance(
            self.cluster_time_ms,
            stamped_ms,
            self.params.max_clock_step_ms,
        );
        if let Some(change) = change {
            self.params = change.apply_to(self.params);
        }
        (log_id, self.cluster_time_ms)
    }

    /// Applies one entry's commands at `log_id` and cluster time `now_ms` on both replicas.
    /// An entry over the per-entry limit, which a leader never proposes, is skipped (the
    /// router refuses it with a panic by design).
    pub fn apply_commands(
        &mut self,
        log_id: LogPosition,
        now_ms: u64,
        params: ClusterParams,
        commands: &[Command],
    ) -> Vec<Result<Decision, LedgerError>> {
        if commands.len() > MAX_COMMANDS_PER_ENTRY {
            return Vec::new();
        }
        let mut results = Vec::with_capacity(commands.len());
        for (position, command) in commands.iter().enumerate() {
            if self.commands_applied >= MAX_COMMANDS_PER_INPUT {
                break;
            }
            self.commands_applied += 1;
            let ctx = ApplyCtx {
                log_id,
                command_position: position,
                now_ms,
                params,
                no_space: false,
            };
            let first = self.replicas[0].apply(command, &ctx);
            let second = self.replicas[1].apply(command, &ctx);
            assert_eq!(
                first, second,
                "two replicas answered {command:?} differently"
            );
            match &first {
                Ok(decision) => {
                    proto::<Decision, pb::Decision>("decision", decision);
                    self.event_ids.push(decision.event_id.clone());
                }
                Err(error) => {
                    proto::<LedgerError, pb::ErrorDetail>("ledger error", error);
                }
            }
            results.push(first);
        }
        results
    }

    /// A whole entry of commands stamped `stamped_ms`.
    pub fn apply_entry(
        &mut self,
        stamped_ms: u64,
        commands: &[Command],
    ) -> Vec<Result<Decision, LedgerError>> {
        let (log_id, now_ms) = self.enter(stamped_ms, None);
        let params = self.params;
        self.apply_commands(log_id, now_ms, params, commands)
    }

    /// The end-of-input checks: replicas byte-identical, snapshots round trip, and the reads
    /// a client makes survive the wire.
    pub fn finish(self) {
        let [first, second] = self.replicas;
        assert_eq!(
            first.families.keys().collect::<Vec<_>>(),
            second.families.keys().collect::<Vec<_>>()
        );
        for ((family_id, family), other) in first.families.iter().zip(second.families.values()) {
            let bytes = family.to_snapshot_bytes();
            assert_eq!(
                bytes,
                other.to_snapshot_bytes(),
                "family {family_id}: two replicas encode differently"
            );
            let restored = Family::from_snapshot_bytes(&bytes)
                .unwrap_or_else(|e| panic!("family {family_id}: own snapshot: {e}"));
            assert_eq!(&restored, family, "family {family_id}: snapshot round trip");
            assert_eq!(restored.to_snapshot_bytes(), bytes);
            assert_eq!(restored.digest(), family.digest());
            assert!(restored.invariant_violations().is_empty());
            check_reads(family_id, family);
            // Reads as a node answers them: the family, then its rows out of memory.
            let cold = first.cold.get(family_id).cloned().unwrap_or_default();
            for event_id in &self.event_ids {
                let lookup = cold.get_event(family, event_id);
                proto::<EventLookup, pb::EventLookup>("event lookup", &lookup);
                assert_eq!(lookup, cold.get_event(&restored, event_id));
            }
        }
    }
}

/// Every read of one family through its wire form and back.
fn check_reads(family_id: &FamilyId, family: &Family) {
    let holds: Vec<_> = family
        .list_holds(&HoldFilter::default(), MAX_LIST_LIMIT)
        .into_iter()
        .map(|hold| (family_id.clone(), hold))
        .collect();
    let page = pb::ListHoldsReply::from_holds(&holds, MAX_LIST_LIMIT)
        .into_page()
        .unwrap_or_else(|e| panic!("holds page of {family_id}: {e:?}"));
    assert_eq!(
        page.holds, holds,
        "holds of {family_id} changed on the wire"
    );
    for (_, hold) in &holds {
        let view = family.get_hold(&hold.hold_id);
        let back = pb::GetHoldReply::from_view(family_id, view.as_ref())
            .into_view()
            .unwrap_or_else(|e| panic!("hold view {}: {e:?}", hold.hold_id));
        assert_eq!(back, view, "hold view changed on the wire");
    }
    let usages: Vec<_> = family
        .list_usages(None, None, MAX_LIST_LIMIT)
        .into_iter()
        .map(|row| (family_id.clone(), row))
        .collect();
    let page = pb::ListUsagesReply::from_rows(&usages, MAX_LIST_LIMIT)
        .into_page()
        .unwrap_or_else(|e| panic!("usage page of {family_id}: {e:?}"));
    assert_eq!(
        page.rows, usages,
        "usages of {family_id} changed on the wire"
    );
    let events = family.list_events(None, None, None, MAX_LIST_LIMIT);
    let back = pb::ListEventsReply::from_records(&events)
        .into_records()
        .unwrap_or_else(|e| panic!("events of {family_id}: {e:?}"));
    assert_eq!(back, events, "events of {family_id} changed on the wire");
}

/// Runs `commands` as one entry per `chunk` commands, stamped one second apart from `t0`.
pub fn run(commands: &[Command], chunk: usize, t0: u64) {
    let mut harness = Harness::new();
    for (i, entry) in commands.chunks(chunk.max(1)).enumerate() {
        harness.apply_entry(t0 + 1_000 * i as u64, entry);
    }
    harness.finish();
}

/// A realistic command stream for seeds: every command kind on one family, replays, a
/// resolve and an expiry.
pub fn sample_commands(t0: u64) -> Vec<Command> {
    use tally_ledger::{
        AccountKey, AncestorAccount, ClientCommand, CommandHeader, GrantLimits, Operation,
    };
    let header = |event: &str| CommandHeader {
        family_id: "fam".into(),
        capability_id: "cap".into(),
        grant_index: 0,
        event_id: event.into(),
        not_after_ms: t0 + 60_000,
    };
    let limits = GrantLimits::monetary(Some(5), Some(100), Some(1_000), "USD");
    let cmd = |event: &str, op: Operation| {
        Command::Apply(ClientCommand {
            header: header(event),
            op,
        })
    };
    let authorize = cmd(
        "ev-auth",
        Operation::AuthorizeHold {
            hold_id: "h1".into(),
            requested_exposure_units: 40,
            limits: limits.clone(),
            ancestors: vec![AncestorAccount {
                account: AccountKey::new("root", 0),
                limits: GrantLimits::monetary(None, None, Some(5_000), "USD"),
            }],
            hold_timeout_ms: Some(30_000),
        },
    );
    vec![
        authorize.clone(),
        cmd(
            "ev-cap",
            Operation::CaptureInvocation {
                hold_id: "h1".into(),
                attempt_id: "att-1".into(),
            },
        ),
        cmd(
            "ev-rel",
            Operation::ReleaseHold {
                hold_id: "h1".into(),
                released_exposure_units: 10,
            },
        ),
        cmd(
            "ev-rec",
            Operation::ReconcileHold {
                hold_id: "h1".into(),
                exposed_cost_units: 30,
                realized_spend_units: 25,
            },
        ),
        authorize,
        cmd(
            "ev-auth2",
            Operation::AuthorizeHold {
                hold_id: "h2".into(),
                requested_exposure_units: 50,
                limits: limits.clone(),
                ancestors: vec![],
                hold_timeout_ms: Some(1_000),
            },
        ),
        cmd(
            "ev-cancel",
            Operation::CancelCapturedBeforeDispatch {
                hold_id: "h2".into(),
            },
        ),
        cmd(
            "ev-rev",
            Operation::ReverseHold {
                hold_id: "h2".into(),
                exposure_units: 50,
            },
        ),
        cmd(
            "ev-inc",
            Operation::TryIncrement {
                limits: GrantLimits::invocations(7),
            },
        ),
        cmd(
            "ev-charge",
            Operation::TryChargeCost {
                cost_units: 9,
                limits: limits.clone(),
            },
        ),
        cmd("ev-rcc", Operation::ReverseChargeCost { cost_units: 9 }),
        cmd("ev-red", Operation::ReduceChargeCost { cost_units: 4 }),
        cmd(
            "ev-settle",
            Operation::SettleChargeCost {
                exposed_cost_units: 5,
                realized_spend_units: 3,
            },
        ),
        cmd(
            "ev-nonce",
            Operation::ConsumeNonce {
                nonce_id: "n1".into(),
                expires_at_ms: t0 + 30_000,
            },
        ),
        Command::Resolve(ClientCommand {
            header: header("ev-never"),
            op: Operation::ReverseChargeCost { cost_units: 1 },
        }),
        Command::ExpireHolds {
            family_id: "fam".into(),
            up_to_ms: t0 + 120_000,
        },
    ]
}
