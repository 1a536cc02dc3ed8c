//! Turns committed entries into rounds of per-family work: each command gets its log
//! position, command position and cluster time, then commands are grouped by family (keeping
//! log order inside each group) so one message per family carries a whole round.

use std::collections::BTreeMap;

use tally_ledger::limits::MAX_COMMANDS_PER_ENTRY;
use tally_ledger::{ApplyCtx, Command, Decision, FamilyId, LedgerError, LogPosition};

use super::entry::{EntryInput, EntryOutput, EntryPayload};
use super::error::RouterError;
use super::router_state::RouterState;

/// One family's share of a round, in log order.
pub(crate) struct FamilyWork {
    pub commands: Vec<(ApplyCtx, Command)>,
    /// `(entry, position)` of each command, parallel to `commands`.
    pub slots: Vec<(usize, usize)>,
    /// Log index of the family's last client command in the round (its LRU key); `None`
    /// when the round only expires its holds. Expiry is not use: after a long downtime the
    /// first leader expires holds in every family at once, and counting that as use kept
    /// every family in memory, far past the budget (docs/sizing.md, restore).
    pub last_used_index: Option<u64>,
}

/// An entry whose results are still coming in.
pub(crate) struct PendingOutput {
    log_id: LogPosition,
    cluster_time_ms: u64,
    results: Vec<Option<Result<Decision, LedgerError>>>,
}

impl PendingOutput {
    pub fn fill(&mut self, position: usize, result: Result<Decision, LedgerError>) {
        let slot = &mut self.results[position];
        assert!(
            slot.is_none(),
            "entry {:?}: position {position} answered twice",
            self.log_id
        );
        *slot = Some(result);
    }

    pub fn finish(self) -> EntryOutput {
        let log_id = self.log_id;
        let results = self
            .results
            .into_iter()
            .enumerate()
            .map(|(position, slot)| match slot {
                Some(result) => result,
                None => panic!("entry {log_id:?}: position {position} was never answered"),
            })
            .collect();
        EntryOutput {
            log_id,
            cluster_time_ms: self.cluster_time_ms,
            results,
        }
    }
}

pub(crate) struct Round {
    pub outputs: Vec<PendingOutput>,
    pub work: BTreeMap<FamilyId, FamilyWork>,
}

/// Splits entries into rounds of at most `max_commands` commands, never splitting an entry.
/// A parameter change starts a round: every command of a round applies under the same
/// parameters, and the families' maintenance times, computed once a round under them, come
/// out the same however a replica's entries were grouped into rounds.
pub(crate) fn split_rounds(entries: Vec<EntryInput>, max_commands: usize) -> Vec<Vec<EntryInput>> {
    let mut rounds = Vec::new();
    let mut current = Vec::new();
    let mut in_current = 0;
    for entry in entries {
        let count = command_count(&entry);
        let changes_params = matches!(
            entry.payload,
            EntryPayload::SetParams(_) | EntryPayload::RaiseRules(_)
        );
        if (in_current + count > max_commands || changes_params) && !current.is_empty() {
            rounds.push(std::mem::take(&mut current));
            in_current = 0;
        }
        in_current += count;
        current.push(entry);
    }
    if !current.is_empty() {
        rounds.push(current);
    }
    rounds
}

fn command_count(entry: &EntryInput) -> usize {
    match &entry.payload {
        EntryPayload::Commands(commands) => commands.len(),
        EntryPayload::Blank
        | EntryPayload::SetParams(_)
        | EntryPayload::Alarm(_)
        | EntryPayload::RaiseRules(_) => 0,
    }
}

/// Advances the router state through the round's entries and builds each command's context.
/// A command whose family id is invalid is answered here (the same error the ledger would
/// give), so garbage ids never get an actor.
pub(crate) fn plan(
    state: &mut RouterState,
    entries: Vec<EntryInput>,
) -> Result<Round, RouterError> {
    let mut outputs = Vec::with_capacity(entries.len());
    let mut work: BTreeMap<FamilyId, FamilyWork> = BTreeMap::new();
    for (entry_no, entry) in entries.into_iter().enumerate() {
        let now_ms = state.enter(&entry)?;
        let commands = match entry.payload {
            EntryPayload::Commands(commands) => commands,
            EntryPayload::Blank
            | EntryPayload::SetParams(_)
            | EntryPayload::Alarm(_)
            | EntryPayload::RaiseRules(_) => Vec::new(),
        };
        assert!(
            commands.len() <= MAX_COMMANDS_PER_ENTRY,
            "entry {:?} carries {} commands, at most {MAX_COMMANDS_PER_ENTRY} fit the commit index",
            entry.log_id,
            commands.len()
        );
        let mut output = PendingOutput {
            log_id: entry.log_id,
            cluster_time_ms: now_ms,
            results: (0..commands.len()).map(|_| None).collect(),
        };
        for (position, command) in commands.into_iter().enumerate() {
            if let Err(error) = command.family_id().validate() {
                output.fill(position, Err(error));
                continue;
            }
            let ctx = ApplyCtx {
                log_id: entry.log_id,
                command_position: position,
                now_ms,
                params: state.params,
                no_space: state.alarms.no_space(),
            };
            let family = work
                .entry(command.family_id().clone())
                .or_insert_with(|| FamilyWork {
                    commands: Vec::new(),
                    slots: Vec::new(),
                    last_used_index: None,
                });
            if !matches!(command, Command::ExpireHolds { .. }) {
                family.last_used_index = Some(entry.log_id.index);
            }
            family.commands.push((ctx, command));
            family.slots.push((entry_no, position));
        }
        outputs.push(output);
    }
    Ok(Round { outputs, work })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_ledger::{ClusterParams, ParamsChange};

    fn entry(index: u64, commands: usize) -> EntryInput {
        let commands = (0..commands)
            .map(|_| Command::ExpireHolds {
                family_id: FamilyId::from("f"),
                up_to_ms: 0,
            })
            .collect();
        EntryInput {
            log_id: LogPosition { term: 1, index },
            stamped_ms: 1_000,
            payload: EntryPayload::Commands(commands),
        }
    }

    /// The log indexes of each round's entries.
    fn round_indexes(rounds: &[Vec<EntryInput>]) -> Vec<Vec<u64>> {
        (rounds.iter())
            .map(|round| round.iter().map(|entry| entry.log_id.index).collect())
            .collect()
    }

    #[test]
    fn rounds_respect_the_limit_without_splitting_entries() {
        let entries = vec![
            entry(1, 3),
            entry(2, 3),
            entry(3, 0),
            entry(4, 5),
            entry(5, 1),
        ];
        let rounds = split_rounds(entries, 6);
        assert_eq!(round_indexes(&rounds), vec![vec![1, 2, 3], vec![4, 5]]);
    }

    /// A parameter change starts a round, so a round's commands share their parameters.
    #[test]
    fn a_parameter_change_starts_a_round() {
        let change = |index: u64, payload: EntryPayload| EntryInput {
            log_id: LogPosition { term: 1, index },
            stamped_ms: 1_000,
            payload,
        };
        let entries = vec![
            entry(1, 1),
            change(2, EntryPayload::SetParams(ParamsChange::default())),
            entry(3, 1),
            change(4, EntryPayload::RaiseRules(3)),
            change(5, EntryPayload::SetParams(ParamsChange::default())),
            change(6, EntryPayload::Blank),
            entry(7, 1),
        ];
        let rounds = split_rounds(entries, 100);
        assert_eq!(
            round_indexes(&rounds),
            vec![vec![1], vec![2, 3], vec![4], vec![5, 6, 7]]
        );
    }

    #[test]
    fn plan_keeps_log_order_per_family_and_stamps_positions() {
        let mut state = RouterState {
            params: ClusterParams::default(),
            ..RouterState::default()
        };
        let round = plan(&mut state, vec![entry(1, 2), entry(2, 1)]).expect("plan");
        let work = &round.work[&FamilyId::from("f")];
        assert_eq!(work.slots, vec![(0, 0), (0, 1), (1, 0)]);
        let positions: Vec<(u64, usize)> = work
            .commands
            .iter()
            .map(|(ctx, _)| (ctx.log_id.index, ctx.command_position))
            .collect();
        assert_eq!(positions, vec![(1, 0), (1, 1), (2, 0)]);
        assert_eq!(work.last_used_index, None, "expiry alone is not use");
        assert!(
            plan(&mut state, vec![entry(2, 1)]).is_err(),
            "a repeated log index is refused"
        );
    }
}
