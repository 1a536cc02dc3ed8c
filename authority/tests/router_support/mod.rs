//! Builders shared by the router tests: commands, entries and a reference applier.

#![allow(dead_code)]

use std::collections::BTreeMap;

use tally_authority::families::{AlarmChange, EntryInput, EntryPayload};
use tally_ledger::cluster_time::advance;
use tally_ledger::limits::MAX_LIST_LIMIT;
use tally_ledger::list_position::hold_order;
use tally_ledger::{
    ApplyCtx, ClientCommand, ClusterParams, ColdRowsInMemory, Command, CommandHeader, Decision,
    Family, FamilyId, GrantLimits, Hold, HoldFilter, LedgerError, LogPosition, Operation,
};

pub const T0: u64 = 1_700_000_000_000;

pub fn family(i: usize) -> FamilyId {
    FamilyId::from(format!("family-{i:03}"))
}

pub fn limits() -> GrantLimits {
    GrantLimits::monetary(Some(10), Some(100), Some(1000), "USD")
}

pub fn header(family_id: &FamilyId, event_id: &str, now_ms: u64) -> CommandHeader {
    CommandHeader {
        family_id: family_id.clone(),
        capability_id: format!("{family_id}-cap").into(),
        grant_index: 0,
        event_id: event_id.into(),
        not_after_ms: now_ms + 60_000,
    }
}

pub fn authorize(
    family_id: &FamilyId,
    hold: &str,
    units: u64,
    now_ms: u64,
    hold_timeout_ms: Option<u64>,
) -> Command {
    Command::Apply(ClientCommand {
        header: header(family_id, &format!("{hold}:authorize"), now_ms),
        op: Operation::AuthorizeHold {
            hold_id: hold.into(),
            requested_exposure_units: units,
            limits: limits(),
            ancestors: vec![],
            hold_timeout_ms,
        },
    })
}

pub fn capture(family_id: &FamilyId, hold: &str, now_ms: u64) -> Command {
    Command::Apply(ClientCommand {
        header: header(family_id, &format!("{hold}:capture"), now_ms),
        op: Operation::CaptureInvocation {
            hold_id: hold.into(),
            attempt_id: "attempt-1".into(),
        },
    })
}

pub fn reconcile(
    family_id: &FamilyId,
    hold: &str,
    exposed: u64,
    realized: u64,
    now_ms: u64,
) -> Command {
    Command::Apply(ClientCommand {
        header: header(family_id, &format!("{hold}:reconcile"), now_ms),
        op: Operation::ReconcileHold {
            hold_id: hold.into(),
            exposed_cost_units: exposed,
            realized_spend_units: realized,
        },
    })
}

pub fn release(family_id: &FamilyId, hold: &str, units: u64, now_ms: u64) -> Command {
    Command::Apply(ClientCommand {
        header: header(family_id, &format!("{hold}:release"), now_ms),
        op: Operation::ReleaseHold {
            hold_id: hold.into(),
            released_exposure_units: units,
        },
    })
}

/// The leader's maintenance command: expires due holds and runs due compactions.
pub fn expire(family_id: &FamilyId, up_to_ms: u64) -> Command {
    Command::ExpireHolds {
        family_id: family_id.clone(),
        up_to_ms,
    }
}

pub fn entry(index: u64, stamped_ms: u64, commands: Vec<Command>) -> EntryInput {
    EntryInput {
        log_id: LogPosition { term: 1, index },
        stamped_ms,
        payload: EntryPayload::Commands(commands),
    }
}

pub fn blank(index: u64, stamped_ms: u64) -> EntryInput {
    EntryInput {
        log_id: LogPosition { term: 1, index },
        stamped_ms,
        payload: EntryPayload::Blank,
    }
}

pub fn set_params(index: u64, stamped_ms: u64, params: ClusterParams) -> EntryInput {
    EntryInput {
        log_id: LogPosition { term: 1, index },
        stamped_ms,
        payload: EntryPayload::SetParams(params.into()),
    }
}

pub fn raise_rules(index: u64, stamped_ms: u64, version: u32) -> EntryInput {
    EntryInput {
        log_id: LogPosition { term: 1, index },
        stamped_ms,
        payload: EntryPayload::RaiseRules(version),
    }
}

pub fn alarm(index: u64, stamped_ms: u64, change: AlarmChange) -> EntryInput {
    EntryInput {
        log_id: LogPosition { term: 1, index },
        stamped_ms,
        payload: EntryPayload::Alarm(change),
    }
}

/// Applies entries command by command to bare families, the way the router must.
#[derive(Default)]
pub struct Reference {
    pub families: BTreeMap<FamilyId, Family>,
    /// Each family's rows out of memory, kept as a node's store would.
    pub cold: BTreeMap<FamilyId, ColdRowsInMemory>,
    pub now_ms: u64,
    pub params: ClusterParams,
    /// Whether `NoSpace` is raised (the router keeps the alarms; the ledger only sees this).
    pub no_space: bool,
}

impl Reference {
    pub fn apply(&mut self, entries: &[EntryInput]) -> Vec<Vec<Result<Decision, LedgerError>>> {
        let mut out = Vec::new();
        for entry in entries {
            self.now_ms = advance(self.now_ms, entry.stamped_ms, self.params.max_clock_step_ms);
            let mut results = Vec::new();
            match &entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::SetParams(change) => self.params = change.apply_to(self.params),
                EntryPayload::Alarm(change) => {
                    self.no_space = matches!(change, AlarmChange::Raise { .. })
                }
                EntryPayload::RaiseRules(version) => self.params.raise_rules(*version),
                EntryPayload::Commands(commands) => {
                    for (position, command) in commands.iter().enumerate() {
                        let ctx = ApplyCtx {
                            log_id: entry.log_id,
                            command_position: position,
                            now_ms: self.now_ms,
                            params: self.params,
                            no_space: self.no_space,
                        };
                        let family = self
                            .families
                            .entry(command.family_id().clone())
                            .or_insert_with(|| Family::new(command.family_id().clone()));
                        let cold = self.cold.entry(command.family_id().clone()).or_default();
                        results.push(cold.apply(family, command, &ctx));
                    }
                }
            }
            out.push(results);
        }
        out
    }
}

impl Reference {
    /// `ListHolds` across every family the brute-force way: every family's every matching
    /// hold (ignoring `filter.after`), merged in list order.
    pub fn all_holds(&self, filter: &HoldFilter) -> Vec<(FamilyId, Hold)> {
        let filter = HoldFilter {
            after: None,
            ..filter.clone()
        };
        let mut all: Vec<(FamilyId, Hold)> = (self.families.iter())
            .flat_map(|(id, family)| {
                let holds = family.list_holds(&filter, MAX_LIST_LIMIT);
                assert!(holds.len() < MAX_LIST_LIMIT, "the test family is too big");
                holds.into_iter().map(move |hold| (id.clone(), hold))
            })
            .collect();
        all.sort_by(|a, b| hold_order((&a.0, &a.1), (&b.0, &b.1)));
        all
    }

    /// The families with at least one live (not archived) hold.
    pub fn families_with_live_holds(&self) -> Vec<FamilyId> {
        (self.families.iter())
            .filter(|(_, family)| family.live_hold_count() > 0)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// A mixed workload over `families` families: allowed holds, denials (over the per-call
/// limit), errors (capture of an unknown hold) and replays, interleaved across families.
pub fn mixed_entries(
    first_index: u64,
    families: usize,
    entries: usize,
    start_ms: u64,
) -> Vec<EntryInput> {
    let mut out = Vec::new();
    for e in 0..entries {
        let index = first_index + e as u64;
        let now = start_ms + e as u64 * 100;
        let mut commands = Vec::new();
        for f in 0..families {
            let fam = family(f);
            let hold = format!("h-{index}-{f}");
            let previous = format!("h-{}-{f}", index.saturating_sub(1));
            match (e + f) % 5 {
                0 => commands.push(authorize(&fam, &hold, 10 + f as u64, now, None)),
                1 => commands.push(authorize(&fam, &hold, 1_000, now, None)), // denied: > 100
                2 => commands.push(capture(&fam, &format!("missing-{index}"), now)), // error
                3 => {
                    commands.push(authorize(&fam, &hold, 5, now, Some(30_000)));
                    commands.push(capture(&fam, &hold, now));
                    commands.push(reconcile(&fam, &hold, 5, 3, now));
                }
                // A replay of the previous entry's hold (now captured and reconciled), or new.
                _ => commands.push(authorize(&fam, &previous, 5, now, Some(30_000))),
            }
        }
        out.push(entry(index, now, commands));
    }
    out
}
