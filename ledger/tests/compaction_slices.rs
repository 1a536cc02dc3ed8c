//! docs/spec.md §5.5 under load: lowering `retention_ms` on a family that retains many events
//! costs every later command a bounded amount of compaction work, and the backlog drains over
//! later commands to the state it would have reached anyway: from rules version 3 as soon as
//! the lowered retention makes it due, before it only once the old retention had passed.

mod support;

use support::*;
use tally_ledger::family::CompactionWork;
use tally_ledger::limits::{
    MAX_COMPACTIONS_PER_CLIENT_COMMAND, MAX_COMPACTIONS_PER_COMMAND, MAX_QUEUE_MOVES_PER_PUSH,
};
use tally_ledger::*;

/// Holds in flight at once, as a bench's concurrent callers keep them: each call's capture
/// and reconcile apply well after newer calls' authorizes, with the call's own deadline, so
/// the compaction queue sees several interleaved streams, not one sorted run.
const IN_FLIGHT: usize = 64;
/// Holds started before the retention is lowered: 4 queued items each stay retained.
const LOADED_HOLDS: usize = 6_000;
/// Holds started after, over more than the new retention, so its compaction runs too.
const LATER_HOLDS: usize = 6_000;
const LOWERED_RETENTION_MS: u64 = 10_000;
/// Cluster time between calls: the later holds span 120 s, past the lowered retention plus
/// the calls' 60 s deadlines.
const STEP_MS: u64 = 20;
/// Items a client command queues: its own retained identity, and a hold it makes final.
const MAX_ITEMS_QUEUED_PER_COMMAND: u64 = 4;

/// Replicas of one family driven with the same commands at the same log positions.
struct Replicas {
    /// Cluster time and log positions, and the family whose work is measured.
    h: Harness,
    /// Restored from a snapshot just before the retention is lowered: the same state laid out
    /// another way (one sorted run, nothing sealed), so it must answer and digest alike.
    /// A replica restored from a snapshot, with its own rows out of memory.
    restored: Option<(Family, ColdRowsInMemory)>,
    /// Never lowers the retention: what the family must end as once everything is compacted.
    reference: Family,
    deadlines: Vec<u64>,
    /// The most compaction work one command did.
    worst: CompactionWork,
}

impl Replicas {
    fn new(rules_version: u32) -> Self {
        let mut h = Harness::new();
        h.params = h.params.at_rules(rules_version);
        Self {
            reference: h.family.clone(),
            h,
            restored: None,
            deadlines: Vec::new(),
            worst: CompactionWork::default(),
        }
    }

    /// Applies `command` to every replica; checks that the measured family did bounded work
    /// and that the restored replica answered alike.
    fn apply(&mut self, command: Command) -> Result<Decision, LedgerError> {
        let ctx = self.h.ctx();
        let maintenance = matches!(command, Command::ExpireHolds { .. });
        let max_steps = ctx.params.max_compactions(maintenance) as u64;
        let before = self.h.family.compaction_work();
        let decision = self.h.apply_at(&command, &ctx);
        let after = self.h.family.compaction_work();
        let work = CompactionWork {
            compacted: after.compacted - before.compacted,
            moved: after.moved - before.moved,
        };
        assert!(
            work.compacted <= max_steps,
            "{} compactions in one command, at most {max_steps}",
            work.compacted
        );
        assert!(
            work.moved <= MAX_ITEMS_QUEUED_PER_COMMAND * MAX_QUEUE_MOVES_PER_PUSH as u64,
            "{} queue items moved in one command at log index {}",
            work.moved,
            ctx.log_id.index
        );
        self.worst.compacted = self.worst.compacted.max(work.compacted);
        self.worst.moved = self.worst.moved.max(work.moved);
        if let Some(restored) = &mut self.restored {
            let (restored, cold) = restored;
            assert_eq!(
                cold.apply(restored, &command, &ctx),
                decision,
                "{command:?}"
            );
        }
        let reference_ctx = ApplyCtx {
            params: ClusterParams::default(),
            ..ctx
        };
        self.reference.apply(&command, &reference_ctx).expect(
            "the reference applies every command (the workload never depends on compaction)",
        );
        decision
    }

    fn assert_replicas_agree(&self) {
        if let Some((restored, _)) = &self.restored {
            assert_eq!(restored.digest(), self.h.family.digest());
        }
    }

    /// One step of a bench-like load: call `n` authorizes, call `n - IN_FLIGHT / 2`
    /// captures and call `n - IN_FLIGHT` reconciles, each with its call's own deadline.
    fn load_step(&mut self, n: usize) {
        self.h.advance(STEP_MS);
        self.deadlines.push(self.h.now_ms + 60_000);
        let limits = usd(None, Some(100), None);
        let mut calls = vec![(
            n,
            self.h
                .authorize_with(&format!("h{n}"), 10, limits, vec![], None),
        )];
        if let Some(m) = n.checked_sub(IN_FLIGHT / 2) {
            calls.push((m, self.h.capture(&format!("h{m}"), "a")));
        }
        if let Some(m) = n.checked_sub(IN_FLIGHT) {
            calls.push((m, self.h.reconcile(&format!("h{m}"), 10, 6)));
        }
        for (call, mut command) in calls {
            if let Command::Apply(cmd) = &mut command {
                cmd.header.not_after_ms = self.deadlines[call];
            }
            let decision = self.apply(command).expect("applies");
            assert!(!decision.replayed, "{decision:?}");
        }
    }

    /// Maintenance for an idle family (the leader's `ExpireHolds`) until compaction has no
    /// work left; how many commands it took, and how many items they compacted.
    fn drain(&mut self) -> (usize, u64) {
        let start = self.h.family.compaction_work().compacted;
        let mut commands = 0;
        while self
            .h
            .family
            .next_compaction_ms(&self.h.params)
            .is_some_and(|due| due <= self.h.now_ms)
        {
            let before = self.h.family.compaction_work().compacted;
            self.apply(self.h.expire(self.h.now_ms)).expect("applies");
            let done = self.h.family.compaction_work().compacted - before;
            assert!(done > 0, "a maintenance command made no progress");
            commands += 1;
        }
        (commands, self.h.family.compaction_work().compacted - start)
    }
}

#[test]
fn lowering_retention_under_load_compacts_the_backlog_in_bounded_slices_from_rules_3() {
    lowering_retention_under_load(3);
}

#[test]
fn lowering_retention_under_load_compacts_in_bounded_slices_to_the_same_end_state() {
    lowering_retention_under_load(2);
}

fn lowering_retention_under_load(rules_version: u32) {
    let mut r = Replicas::new(rules_version);
    for n in 0..LOADED_HOLDS {
        r.load_step(n);
    }
    assert_eq!(
        r.h.family.journal_len(),
        3 * LOADED_HOLDS - IN_FLIGHT / 2 - IN_FLIGHT,
        "every event is retained under the default retention"
    );
    assert_eq!(r.h.family.compaction_work().compacted, 0);

    // The snapshot a lagging replica would install, then `tally params --retention-ms 10000`.
    r.restored = Some((
        Family::from_snapshot_bytes(&r.h.family.to_snapshot_bytes()).expect("decodes"),
        r.h.cold.clone(),
    ));
    r.h.params.retention_ms = LOWERED_RETENTION_MS;
    for n in LOADED_HOLDS..LOADED_HOLDS + LATER_HOLDS {
        r.load_step(n);
        if n % 1_000 == 0 {
            r.assert_replicas_agree();
        }
    }
    r.assert_replicas_agree();
    let compacted_under_load = r.h.family.compaction_work().compacted;
    assert!(
        compacted_under_load > 3 * (LATER_HOLDS as u64) / 2,
        "events queued under the lowered retention compact during the load: {compacted_under_load}"
    );
    // Calls loaded before the change whose reconcile applied then: under version 3 their
    // events fell due 10 s after their deadline, during the later load; before it, each
    // keeps the 24 h it was queued with.
    for n in (0..LOADED_HOLDS - IN_FLIGHT).step_by(97) {
        let event = EventId::from(format!("h{n}:authorize").as_str());
        let lookup = r.h.cold.get_event(&r.h.family, &event);
        let compacted = matches!(lookup, EventLookup::Applied { record: None, .. });
        assert_eq!(compacted, rules_version >= 3, "{event:?}: {lookup:?}");
    }
    if rules_version >= 3 {
        assert_eq!(
            r.worst.compacted, MAX_COMPACTIONS_PER_CLIENT_COMMAND as u64,
            "client commands drained the backlog at their bound"
        );
        assert!(
            r.h.family.journal_len() < 3 * LATER_HOLDS,
            "only events of later calls are retained: {}",
            r.h.family.journal_len()
        );
    } else {
        assert!(
            r.h.family.journal_len() > 3 * LOADED_HOLDS,
            "events queued under the old retention keep it"
        );
    }

    // Past the old retention of the last call loaded before the change, every item is due at
    // once: maintenance drains the backlog a bounded slice per command.
    // A snapshot's cut shares the family meanwhile: compaction archives holds the cut still
    // holds (copied, not moved), and must leave the cut as it was and the family as the
    // restored replica, which shares nothing, ends.
    let cut = r.h.family.clone();
    let cut_bytes = cut.to_snapshot_bytes();
    r.h.advance(ClusterParams::default().retention_ms + 120_000);
    let (commands, backlog) = r.drain();
    assert_eq!(
        cut.to_snapshot_bytes(),
        cut_bytes,
        "what the family did after the cut did not reach the cut"
    );
    drop(cut);
    // Each retained command, and each hold its reconcile made final.
    let retained_before = 3 * LOADED_HOLDS - IN_FLIGHT / 2 - IN_FLIGHT + LOADED_HOLDS - IN_FLIGHT;
    if rules_version >= 3 {
        assert!(
            compacted_under_load >= retained_before as u64,
            "the backlog drained under load: {compacted_under_load} items"
        );
        assert!(backlog > 0, "later calls' items drained");
    } else {
        assert!(backlog >= retained_before as u64, "{backlog} items drained");
    }
    assert_eq!(
        commands,
        backlog.div_ceil(MAX_COMPACTIONS_PER_COMMAND as u64) as usize,
        "every slice but the last is full, and none is larger"
    );
    assert_eq!(
        r.h.family.journal_len(),
        0,
        "the backlog drained completely"
    );
    assert_eq!(r.h.family.next_compaction_ms(&r.h.params), None);
    assert!(r.h.family.invariant_violations().is_empty());
    r.assert_replicas_agree();

    // The reference kept 24 h for every command and has compacted everything too. Its bytes
    // differ (a dedupe row keeps the queue key its identity waited under, which holds the
    // retention in force then), but every read answers alike: lowering the retention changed
    // when compaction ran, not what it left.
    while r
        .reference
        .next_compaction_ms(&ClusterParams::default())
        .is_some_and(|due| due <= r.h.now_ms)
    {
        let ctx = ApplyCtx {
            params: ClusterParams::default(),
            ..r.h.ctx()
        };
        let expire = r.h.expire(r.h.now_ms);
        r.reference.apply(&expire, &ctx).expect("applies");
    }
    assert_eq!(r.reference.journal_len(), 0);
    assert_eq!(
        r.reference.next_compaction_ms(&ClusterParams::default()),
        None
    );
    let account = AccountKey::new(CAP, 0);
    assert_eq!(
        r.reference.get_usage(&account),
        r.h.family.get_usage(&account)
    );
    for n in 0..LOADED_HOLDS + LATER_HOLDS {
        let hold = HoldId::from(format!("h{n}").as_str());
        let view = r.h.cold.get_hold(&r.h.family, &hold);
        assert!(
            n + IN_FLIGHT >= LOADED_HOLDS + LATER_HOLDS
                || matches!(view, Some(HoldView::Archived { .. })),
            "h{n}: {view:?}"
        );
        assert_eq!(view, r.reference.get_hold(&hold), "h{n}");
        for verb in ["authorize", "capture", "reconcile"] {
            let event = EventId::from(format!("h{n}:{verb}").as_str());
            let lookup = r.h.cold.get_event(&r.h.family, &event);
            assert!(
                matches!(
                    lookup,
                    EventLookup::Applied { record: None, .. } | EventLookup::Unknown
                ),
                "{event:?}: {lookup:?}"
            );
            assert_eq!(lookup, r.reference.get_event(&event), "{event:?}");
        }
    }
}
