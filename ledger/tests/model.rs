//! Model-based test: random command sequences (fresh commands, exact replays of earlier ones,
//! twin captures, tombstones, expiry, compaction) run against the ledger and a small reference
//! model written independently from docs/spec.md. After every step the ledger's answer must match
//! the model's prediction, account rows must match the model's fold, and docs/spec.md §11
//! invariants 1–5 and 7 must hold.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use tally_ledger::*;

const T0: u64 = 1_700_000_000_000;
const TTL_MS: u64 = 10_000;
const RETENTION_MS: u64 = 24 * 3_600_000;
const HOLDS: u8 = 6;

// ---------------------------------------------------------------- commands

#[derive(Clone, Debug, PartialEq)]
enum Op {
    Authorize {
        hold: u8,
        units: u64,
        timeout_ms: Option<u64>,
    },
    Capture {
        hold: u8,
        attempt: u8,
    },
    Cancel {
        hold: u8,
    },
    Reverse {
        hold: u8,
        units: u64,
    },
    Release {
        hold: u8,
        units: u64,
        tag: u8,
    },
    Reconcile {
        hold: u8,
        exposed: u64,
        realized: u64,
    },
    Charge {
        units: u64,
        tag: u8,
    },
    ReverseCharge {
        units: u64,
        tag: u8,
    },
}

#[derive(Clone, Debug, PartialEq)]
struct Cmd {
    op: Op,
    not_after_ms: u64,
    resolve: bool,
}

#[derive(Clone, Debug)]
enum Transition {
    Fresh(Op),
    /// An exact copy of an earlier command (same event id, same deadline).
    Replay(Cmd),
    /// `ResolveEvent` for a fresh command that is never sent, or for an earlier one.
    Resolve(Cmd),
    Advance(u64),
    Expire,
    /// Jump past every deadline and retention, then expire: all due compaction runs.
    Compact,
    /// The `NoSpace` alarm raised (`true`) or cleared through the log (docs/spec.md §5.6).
    Alarm(bool),
}

fn account_of(hold: u8) -> Vec<&'static str> {
    if hold.is_multiple_of(2) {
        vec!["solo"]
    } else {
        vec!["child", "root"]
    }
}

fn limits_of(account: &str) -> GrantLimits {
    let (inv, per, total) = match account {
        "solo" => (Some(4), Some(100), Some(300)),
        "child" => (Some(3), Some(80), Some(200)),
        _ => (None, Some(100), Some(150)),
    };
    GrantLimits::monetary(inv, per, total, "USD")
}

fn event_id(op: &Op) -> String {
    match op {
        Op::Authorize { hold, .. } => format!("h{hold}:authorize"),
        Op::Capture { hold, .. } => format!("h{hold}:capture"),
        Op::Cancel { hold } => format!("h{hold}:cancel"),
        Op::Reverse { hold, .. } => format!("h{hold}:reverse"),
        Op::Release { hold, tag, .. } => format!("h{hold}:release:{tag}"),
        Op::Reconcile { hold, .. } => format!("h{hold}:reconcile"),
        Op::Charge { tag, .. } => format!("legacy:charge:{tag}"),
        Op::ReverseCharge { tag, .. } => format!("legacy:reverse:{tag}"),
    }
}

/// The model's notion of identity: everything but attempt, timeout and deadline.
fn identity(op: &Op) -> String {
    match op {
        Op::Authorize { hold, units, .. } => format!("authorize {hold} {units}"),
        Op::Capture { hold, .. } => format!("capture {hold}"),
        Op::Cancel { hold } => format!("cancel {hold}"),
        Op::Reverse { hold, units } => format!("reverse {hold} {units}"),
        Op::Release { hold, units, .. } => format!("release {hold} {units}"),
        Op::Reconcile {
            hold,
            exposed,
            realized,
        } => format!("reconcile {hold} {exposed} {realized}"),
        Op::Charge { units, .. } => format!("charge {units}"),
        Op::ReverseCharge { units, .. } => format!("reverse_charge {units}"),
    }
}

fn to_ledger(cmd: &Cmd) -> Command {
    let (account, hold) = match &cmd.op {
        Op::Authorize { hold, .. }
        | Op::Capture { hold, .. }
        | Op::Cancel { hold }
        | Op::Reverse { hold, .. }
        | Op::Release { hold, .. }
        | Op::Reconcile { hold, .. } => {
            (account_of(*hold)[0], Some(HoldId::from(format!("h{hold}"))))
        }
        _ => ("solo", None),
    };
    let hold_id = || hold.clone().expect("hold op");
    let op = match &cmd.op {
        Op::Authorize {
            hold,
            units,
            timeout_ms,
        } => Operation::AuthorizeHold {
            hold_id: hold_id(),
            requested_exposure_units: *units,
            limits: limits_of(account),
            ancestors: account_of(*hold)[1..]
                .iter()
                .map(|a| AncestorAccount {
                    account: AccountKey::new(*a, 0),
                    limits: limits_of(a),
                })
                .collect(),
            hold_timeout_ms: *timeout_ms,
        },
        Op::Capture { attempt, .. } => Operation::CaptureInvocation {
            hold_id: hold_id(),
            attempt_id: AttemptId::from(format!("attempt-{attempt}")),
        },
        Op::Cancel { .. } => Operation::CancelCapturedBeforeDispatch { hold_id: hold_id() },
        Op::Reverse { units, .. } => Operation::ReverseHold {
            hold_id: hold_id(),
            exposure_units: *units,
        },
        Op::Release { units, .. } => Operation::ReleaseHold {
            hold_id: hold_id(),
            released_exposure_units: *units,
        },
        Op::Reconcile {
            exposed, realized, ..
        } => Operation::ReconcileHold {
            hold_id: hold_id(),
            exposed_cost_units: *exposed,
            realized_spend_units: *realized,
        },
        Op::Charge { units, .. } => Operation::TryChargeCost {
            cost_units: *units,
            limits: limits_of("solo"),
        },
        Op::ReverseCharge { units, .. } => Operation::ReverseChargeCost { cost_units: *units },
    };
    let client = ClientCommand {
        header: CommandHeader {
            family_id: FamilyId::from("fam"),
            capability_id: CapabilityId::from(account),
            grant_index: 0,
            event_id: EventId::from(event_id(&cmd.op)),
            not_after_ms: cmd.not_after_ms,
        },
        op,
    };
    if cmd.resolve {
        Command::Resolve(client)
    } else {
        Command::Apply(client)
    }
}

// ---------------------------------------------------------------- the model

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inv {
    Authorized,
    Captured,
    Reversed,
}

#[derive(Clone, Debug)]
struct HoldM {
    hold: u8,
    authorized: u64,
    remaining: u64,
    released: u64,
    inv: Inv,
    reconciled: bool,
    owner: Option<u8>,
    expires_at: Option<u64>,
    /// Final (terminal, or captured without exposure) since this time.
    final_at: Option<u64>,
    archived: bool,
}

#[derive(Clone, Debug)]
enum Slot {
    Denied,
    Live(HoldM),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct AccountM {
    count: u32,
    reserved: u32,
    captured: u32,
    legacy_count: u32,
    legacy_exposed: u64,
    exposed: u64,
    realized: u64,
}

/// What the ledger must answer.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Expect {
    Authorized,
    Denied,
    Captured,
    AlreadyCaptured {
        owner: u8,
    },
    Cancelled,
    Reversed,
    AlreadyReversed,
    Released,
    Reconciled,
    Charged,
    ChargeReversed,
    ResolvedApplied,
    NotApplied,
    HoldsExpired(usize),
    Conflict,
    Failed(PreconditionCode),
    /// Refused while `NoSpace` is raised: not applied, not recorded.
    NoSpace,
    /// Failed, but an expiry of the touched hold was appended first.
    FailedAfterExpiry(PreconditionCode),
}

#[derive(Clone, Debug)]
enum DedupeM {
    Applied {
        identity: String,
        answer: Expect,
        replay_watches: bool,
    },
    Tombstoned {
        identity: String,
        due: u64,
    },
}

#[derive(Clone, Debug)]
struct Model {
    now: u64,
    accounts: BTreeMap<&'static str, AccountM>,
    holds: BTreeMap<u8, Slot>,
    dedupe: BTreeMap<String, DedupeM>,
    history: Vec<Cmd>,
    last: Option<(Transition, Expect)>,
    /// Whether the `NoSpace` alarm is raised.
    no_space: bool,
}

impl Model {
    fn new() -> Self {
        Self {
            now: T0,
            accounts: BTreeMap::new(),
            holds: BTreeMap::new(),
            dedupe: BTreeMap::new(),
            history: Vec::new(),
            last: None,
            no_space: false,
        }
    }

    fn live(&self, hold: u8) -> Option<&HoldM> {
        match self.holds.get(&hold) {
            Some(Slot::Live(h)) => Some(h),
            _ => None,
        }
    }

    fn live_mut(&mut self, hold: u8) -> &mut HoldM {
        match self.holds.get_mut(&hold) {
            Some(Slot::Live(h)) => h,
            _ => panic!("model: hold {hold} not live"),
        }
    }

    fn run(&mut self, cmd: &Cmd) -> Expect {
        let id = event_id(&cmd.op);
        let ident = identity(&cmd.op);
        match self.dedupe.get(&id).cloned() {
            Some(DedupeM::Tombstoned { identity, .. }) => {
                return if identity != ident {
                    Expect::Conflict
                } else if cmd.resolve {
                    Expect::NotApplied
                } else {
                    Expect::Failed(PreconditionCode::EventAborted)
                };
            }
            Some(DedupeM::Applied {
                identity,
                answer,
                replay_watches,
            }) => {
                return if identity != ident {
                    Expect::Conflict
                } else if cmd.resolve {
                    Expect::ResolvedApplied
                } else if replay_watches {
                    self.replay(&cmd.op, answer)
                } else {
                    answer
                };
            }
            None => {}
        }
        if cmd.resolve {
            let due = cmd.not_after_ms.max(self.now) + RETENTION_MS;
            if cmd.not_after_ms + RETENTION_MS >= self.now {
                self.dedupe.insert(
                    id,
                    DedupeM::Tombstoned {
                        identity: ident,
                        due,
                    },
                );
            }
            return Expect::NotApplied;
        }
        if cmd.not_after_ms < self.now {
            return Expect::Failed(PreconditionCode::CommandExpired);
        }
        // docs/spec.md §5.6: only fresh commands that open new exposure are refused.
        if self.no_space && matches!(cmd.op, Op::Authorize { .. } | Op::Charge { .. }) {
            return Expect::NoSpace;
        }
        let answer = self.fresh(&cmd.op);
        let stored = match answer {
            Expect::Conflict
            | Expect::Failed(_)
            | Expect::FailedAfterExpiry(_)
            | Expect::NoSpace => None,
            ref ok => Some(ok.clone()),
        };
        if let Some(answer) = stored {
            let replay_watches = matches!(
                (&cmd.op, &answer),
                (Op::Authorize { .. }, Expect::Authorized) | (Op::Capture { .. }, Expect::Captured)
            );
            self.dedupe.insert(
                id,
                DedupeM::Applied {
                    identity: ident,
                    answer,
                    replay_watches,
                },
            );
        }
        answer
    }

    fn replay(&self, op: &Op, answer: Expect) -> Expect {
        let hold = match op {
            Op::Authorize { hold, .. } | Op::Capture { hold, .. } => *hold,
            _ => unreachable!(),
        };
        let h = self.live(hold).expect("a watched hold exists");
        match h.inv {
            Inv::Authorized if h.expires_at.is_some_and(|t| t <= self.now) => {
                Expect::Failed(PreconditionCode::HoldExpired)
            }
            Inv::Authorized => answer,
            Inv::Captured => Expect::AlreadyCaptured {
                owner: h.owner.expect("owner"),
            },
            Inv::Reversed if matches!(op, Op::Authorize { .. }) => {
                Expect::Failed(PreconditionCode::TerminallyReversed)
            }
            Inv::Reversed => Expect::Failed(PreconditionCode::Superseded),
        }
    }

    fn fresh(&mut self, op: &Op) -> Expect {
        match *op {
            Op::Authorize {
                hold,
                units,
                timeout_ms,
            } => self.authorize(hold, units, timeout_ms),
            Op::Charge { units, .. } => self.charge(units),
            Op::ReverseCharge { units, .. } => self.reverse_charge(units),
            _ => self.hold_op(op),
        }
    }

    fn committed(a: &AccountM) -> u64 {
        a.exposed + a.realized
    }

    fn admits(&self, account: &str, units: u64, quota_only: bool) -> bool {
        let a = self.accounts.get(account).cloned().unwrap_or_default();
        let l = limits_of(account);
        if l.max_invocations.is_some_and(|m| a.count >= m) {
            return false;
        }
        if quota_only {
            return true;
        }
        !(l.max_cost_per_invocation_units.is_some_and(|m| units > m)
            || l.max_total_cost_units
                .is_some_and(|m| Self::committed(&a) + units > m))
    }

    fn authorize(&mut self, hold: u8, units: u64, timeout_ms: Option<u64>) -> Expect {
        if self.holds.contains_key(&hold) {
            return Expect::Conflict;
        }
        let accounts = account_of(hold);
        if !accounts.iter().all(|a| self.admits(a, units, false)) {
            self.holds.insert(hold, Slot::Denied);
            return Expect::Denied;
        }
        for a in &accounts {
            let row = self.accounts.entry(a).or_default();
            row.count += 1;
            row.reserved += 1;
            row.exposed += units;
        }
        self.holds.insert(
            hold,
            Slot::Live(HoldM {
                hold,
                authorized: units,
                remaining: units,
                released: 0,
                inv: Inv::Authorized,
                reconciled: false,
                owner: None,
                expires_at: timeout_ms.map(|t| self.now + t),
                final_at: None,
                archived: false,
            }),
        );
        Expect::Authorized
    }

    fn charge(&mut self, units: u64) -> Expect {
        if !self.admits("solo", units, false) {
            return Expect::Denied;
        }
        let row = self.accounts.entry("solo").or_default();
        row.count += 1;
        row.legacy_count += 1;
        row.legacy_exposed += units;
        row.exposed += units;
        Expect::Charged
    }

    fn reverse_charge(&mut self, units: u64) -> Expect {
        let Some(row) = self.accounts.get_mut("solo") else {
            return Expect::Failed(PreconditionCode::NoAccount);
        };
        if row.legacy_count == 0 || row.legacy_exposed < units {
            return Expect::Failed(PreconditionCode::LegacyBucketShort);
        }
        row.count -= 1;
        row.legacy_count -= 1;
        row.legacy_exposed -= units;
        row.exposed -= units;
        Expect::ChargeReversed
    }

    /// Reverse, cancel or expire.
    fn end(&mut self, hold: u8, captured_slot: bool) {
        let now = self.now;
        let h = self.live_mut(hold);
        let remaining = h.remaining;
        h.remaining = 0;
        h.inv = Inv::Reversed;
        h.final_at = Some(now);
        for a in account_of(hold) {
            let row = self.accounts.get_mut(a).expect("row");
            row.count -= 1;
            row.exposed -= remaining;
            if captured_slot {
                row.captured -= 1;
            } else {
                row.reserved -= 1;
            }
        }
    }

    fn hold_op(&mut self, op: &Op) -> Expect {
        use PreconditionCode as P;
        let hold = match *op {
            Op::Capture { hold, .. }
            | Op::Cancel { hold }
            | Op::Reverse { hold, .. }
            | Op::Release { hold, .. }
            | Op::Reconcile { hold, .. } => hold,
            _ => unreachable!(),
        };
        let Some(h) = self.live(hold).cloned() else {
            return Expect::Failed(P::UnknownHold);
        };
        let mut just_expired = false;
        if h.inv == Inv::Authorized && h.expires_at.is_some_and(|t| t <= self.now) {
            self.end(hold, false);
            just_expired = true;
        }
        let h = self.live(hold).cloned().expect("live");
        let fail = |code| {
            if just_expired {
                Expect::FailedAfterExpiry(code)
            } else {
                Expect::Failed(code)
            }
        };
        match *op {
            Op::Capture { attempt, .. } => {
                if just_expired {
                    return fail(P::HoldExpired);
                }
                if h.archived || h.inv != Inv::Authorized {
                    return fail(P::HoldNotAuthorized);
                }
                if h.authorized > 0 && h.remaining == 0 {
                    return fail(P::NoRemainingExposure);
                }
                let now = self.now;
                let hm = self.live_mut(hold);
                hm.inv = Inv::Captured;
                hm.owner = Some(attempt);
                if hm.authorized == 0 {
                    hm.final_at = Some(now);
                }
                for a in account_of(hold) {
                    let row = self.accounts.get_mut(a).expect("row");
                    row.reserved -= 1;
                    row.captured += 1;
                }
                Expect::Captured
            }
            Op::Cancel { .. } => {
                if just_expired {
                    return fail(P::HoldExpired);
                }
                if h.archived {
                    return fail(P::HoldArchived);
                }
                if h.inv != Inv::Captured {
                    return fail(P::HoldNotCaptured);
                }
                if h.reconciled {
                    return fail(P::AlreadyReconciled);
                }
                if h.remaining != h.authorized {
                    return fail(P::PartiallyReleased);
                }
                self.end(hold, true);
                Expect::Cancelled
            }
            Op::Reverse { units, .. } => {
                if h.inv == Inv::Reversed {
                    return Expect::AlreadyReversed;
                }
                if h.inv != Inv::Authorized {
                    return fail(P::DispatchFenceCrossed);
                }
                if units != h.remaining {
                    return fail(P::ExposureMismatch);
                }
                self.end(hold, false);
                Expect::Reversed
            }
            Op::Release { units, .. } => {
                if just_expired {
                    return fail(P::HoldExpired);
                }
                if h.archived || h.inv == Inv::Reversed {
                    return fail(P::HoldNotAuthorized);
                }
                if h.inv == Inv::Captured {
                    return fail(P::DispatchFenceCrossed);
                }
                if units > h.remaining {
                    return fail(P::ReleaseExceedsRemaining);
                }
                let hm = self.live_mut(hold);
                hm.remaining -= units;
                hm.released += units;
                for a in account_of(hold) {
                    self.accounts.get_mut(a).expect("row").exposed -= units;
                }
                Expect::Released
            }
            Op::Reconcile {
                exposed, realized, ..
            } => {
                if just_expired {
                    return fail(P::HoldExpired);
                }
                if h.archived || h.inv != Inv::Captured {
                    return fail(P::HoldNotCaptured);
                }
                if h.reconciled {
                    return fail(P::AlreadyReconciled);
                }
                if exposed != h.remaining {
                    return fail(P::ExposureMismatch);
                }
                let now = self.now;
                let hm = self.live_mut(hold);
                hm.remaining = 0;
                hm.reconciled = true;
                hm.final_at = Some(now);
                for a in account_of(hold) {
                    let row = self.accounts.get_mut(a).expect("row");
                    row.exposed -= exposed;
                    row.realized += realized;
                }
                Expect::Reconciled
            }
            _ => unreachable!(),
        }
    }

    fn expire(&mut self) -> Expect {
        let mut due: Vec<(u64, u8)> = self
            .holds
            .values()
            .filter_map(|s| match s {
                Slot::Live(h) if h.inv == Inv::Authorized => h.expires_at.map(|t| (t, h.hold)),
                _ => None,
            })
            .filter(|(t, _)| *t <= self.now)
            .collect();
        due.sort();
        for (_, hold) in &due {
            self.end(*hold, false);
        }
        Expect::HoldsExpired(due.len())
    }

    /// What `Compact` does to the model: final holds archive, old tombstones are forgotten.
    fn compact(&mut self) {
        let now = self.now;
        for slot in self.holds.values_mut() {
            if let Slot::Live(h) = slot {
                if h.final_at.is_some_and(|t| t + RETENTION_MS < now) {
                    h.archived = true;
                }
            }
        }
        self.dedupe
            .retain(|_, d| !matches!(d, DedupeM::Tombstoned { due, .. } if *due < now));
    }
}

// ---------------------------------------------------------------- the state machines

struct Reference;

fn hold_ops(state: &Model) -> BoxedStrategy<Op> {
    let remaining = |hold: u8| state.live(hold).map_or(0, |h| h.remaining);
    let remaining: Vec<u64> = (0..HOLDS).map(remaining).collect();
    let r1 = remaining.clone();
    let r2 = remaining.clone();
    let r3 = remaining;
    prop_oneof![
        4 => (0..HOLDS, 0u64..=120, prop::option::of(500u64..4_000))
            .prop_map(|(hold, units, timeout_ms)| Op::Authorize { hold, units, timeout_ms }),
        4 => (0..HOLDS, 0u8..2).prop_map(|(hold, attempt)| Op::Capture { hold, attempt }),
        1 => (0..HOLDS).prop_map(|hold| Op::Cancel { hold }),
        2 => (0..HOLDS, any::<bool>()).prop_map(move |(hold, exact)| Op::Reverse {
            hold,
            units: if exact { r1[hold as usize] } else { r1[hold as usize] + 1 },
        }),
        // Around the remaining exposure, where off-by-one bugs live.
        2 => (0..HOLDS, 0u8..4, 1u64..=60, any::<u8>()).prop_map(move |(hold, pick, random, tag)| {
            let remaining = r3[hold as usize];
            let units = match pick {
                0 => remaining.max(1),
                1 => remaining + 1,
                2 => remaining.saturating_sub(1).max(1),
                _ => random,
            };
            Op::Release { hold, units, tag }
        }),
        3 => (0..HOLDS, 0u64..=100, 0u8..5).prop_map(move |(hold, pct, pick)| {
            let exposed = match pick {
                0 => r2[hold as usize] + 1,
                _ => r2[hold as usize].max(1),
            };
            Op::Reconcile { hold, exposed, realized: exposed * pct / 100 }
        }),
        1 => (0u64..=120, any::<u8>()).prop_map(|(units, tag)| Op::Charge { units, tag }),
        1 => (0u64..=120, any::<u8>()).prop_map(|(units, tag)| Op::ReverseCharge { units, tag }),
    ]
    .boxed()
}

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model::new()).boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Transition> {
        let fresh = hold_ops(state).prop_map(Transition::Fresh);
        let resolve_fresh = hold_ops(state).prop_map({
            let now = state.now;
            move |op| {
                Transition::Resolve(Cmd {
                    op,
                    not_after_ms: now + TTL_MS,
                    resolve: true,
                })
            }
        });
        let time = prop_oneof![
            3 => (0u64..3_000).prop_map(Transition::Advance),
            2 => Just(Transition::Expire),
            1 => Just(Transition::Compact),
            1 => any::<bool>().prop_map(Transition::Alarm),
        ];
        if state.history.is_empty() {
            return prop_oneof![8 => fresh, 1 => resolve_fresh, 2 => time].boxed();
        }
        let history = state.history.clone();
        let replay = prop::sample::select(history.clone()).prop_map(Transition::Replay);
        let resolve_old = prop::sample::select(history).prop_map(|cmd| {
            Transition::Resolve(Cmd {
                resolve: true,
                ..cmd
            })
        });
        prop_oneof![8 => fresh, 3 => replay, 1 => resolve_fresh, 1 => resolve_old, 2 => time]
            .boxed()
    }

    fn apply(mut state: Model, transition: &Transition) -> Model {
        let expect = match transition {
            Transition::Fresh(op) => {
                let cmd = Cmd {
                    op: op.clone(),
                    not_after_ms: state.now + TTL_MS,
                    resolve: false,
                };
                state.history.push(cmd.clone());
                state.run(&cmd)
            }
            Transition::Replay(cmd) | Transition::Resolve(cmd) => state.run(cmd),
            Transition::Advance(ms) => {
                state.now += ms;
                Expect::HoldsExpired(0)
            }
            Transition::Expire => state.expire(),
            Transition::Compact => {
                state.now += 2 * RETENTION_MS;
                let expired = state.expire();
                state.compact();
                expired
            }
            Transition::Alarm(raised) => {
                state.no_space = *raised;
                state.expire()
            }
        };
        state.last = Some((transition.clone(), expect));
        state
    }
}

struct Sut {
    family: Family,
    /// A second replica fed the same commands (docs/spec.md §11 invariant 10): its tables hash ids
    /// with other seeds, so only the rows, never where they sit, may reach its answers or bytes.
    replica: Family,
    /// Each replica's rows out of memory, as its node's store keeps them.
    cold: ColdRowsInMemory,
    replica_cold: ColdRowsInMemory,
    log_index: u64,
    now: u64,
    /// Commit index of every applied event id's first answer.
    first_index: BTreeMap<String, Option<BudgetCommitIndex>>,
    /// The one attempt that ever got `Captured`, per hold.
    capture_owner: BTreeMap<String, AttemptId>,
    /// Whether the `NoSpace` alarm is raised (the router's replicated state, in a node).
    no_space: bool,
}

impl Sut {
    fn apply(&mut self, command: &Command) -> Result<Decision, LedgerError> {
        self.log_index += 1;
        let ctx = ApplyCtx {
            log_id: LogPosition {
                term: 1,
                index: self.log_index,
            },
            command_position: 0,
            now_ms: self.now,
            params: ClusterParams {
                retention_ms: RETENTION_MS,
                max_clock_step_ms: 10_000,
                ..ClusterParams::default()
            }
            .at_rules(tally_ledger::CURRENT_RULES),
            no_space: self.no_space,
        };
        let result = self.cold.apply(&mut self.family, command, &ctx);
        let replica_result = self.replica_cold.apply(&mut self.replica, command, &ctx);
        assert_eq!(replica_result, result, "the replica answers alike");
        result
    }
}

fn observed(result: &Result<Decision, LedgerError>) -> Expect {
    match result {
        Ok(d) => match &d.outcome {
            Outcome::Authorized { .. } => Expect::Authorized,
            Outcome::Denied { .. } => Expect::Denied,
            Outcome::Captured { .. } => Expect::Captured,
            Outcome::AlreadyCaptured {
                owner_attempt_id, ..
            } => Expect::AlreadyCaptured {
                owner: owner_attempt_id
                    .as_str()
                    .trim_start_matches("attempt-")
                    .parse()
                    .expect("attempt"),
            },
            Outcome::Cancelled { .. } => Expect::Cancelled,
            Outcome::Reversed { .. } => Expect::Reversed,
            Outcome::AlreadyReversed { .. } => Expect::AlreadyReversed,
            Outcome::Released { .. } => Expect::Released,
            Outcome::Reconciled { .. } => Expect::Reconciled,
            Outcome::Charged { .. } => Expect::Charged,
            Outcome::ChargeReversed { .. } => Expect::ChargeReversed,
            Outcome::Resolved(Resolution::Applied(_)) => Expect::ResolvedApplied,
            Outcome::Resolved(Resolution::NotApplied) => Expect::NotApplied,
            Outcome::HoldsExpired { hold_ids, .. } => Expect::HoldsExpired(hold_ids.len()),
            other => panic!("the model never asks for {other:?}"),
        },
        Err(LedgerError::Conflict(_)) => Expect::Conflict,
        Err(LedgerError::FailedPrecondition { code, .. }) => Expect::Failed(*code),
        Err(LedgerError::NoSpace { .. }) => Expect::NoSpace,
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

struct LedgerUnderTest;

impl StateMachineTest for LedgerUnderTest {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(_: &Model) -> Sut {
        Sut {
            family: Family::new(FamilyId::from("fam")),
            replica: Family::new(FamilyId::from("fam")),
            cold: ColdRowsInMemory::default(),
            replica_cold: ColdRowsInMemory::default(),
            log_index: 0,
            now: T0,
            first_index: BTreeMap::new(),
            capture_owner: BTreeMap::new(),
            no_space: false,
        }
    }

    fn apply(mut sut: Sut, model: &Model, transition: Transition) -> Sut {
        let (_, expect) = model.last.clone().expect("the model recorded the step");
        let digest_before = sut.family.digest();
        let journal_before = sut.family.journal_len();
        let (command, result) = match &transition {
            Transition::Fresh(_) => {
                let cmd = model.history.last().expect("fresh commands are recorded");
                let command = to_ledger(cmd);
                let result = sut.apply(&command);
                (Some(command), result)
            }
            Transition::Replay(cmd) | Transition::Resolve(cmd) => {
                let command = to_ledger(cmd);
                let result = sut.apply(&command);
                (Some(command), result)
            }
            Transition::Advance(ms) => {
                sut.now += ms;
                let result = sut.apply(&Command::ExpireHolds {
                    family_id: "fam".into(),
                    up_to_ms: 0,
                });
                (None, result)
            }
            Transition::Expire => {
                let now = sut.now;
                (
                    None,
                    sut.apply(&Command::ExpireHolds {
                        family_id: "fam".into(),
                        up_to_ms: now,
                    }),
                )
            }
            Transition::Compact => {
                sut.now += 2 * RETENTION_MS;
                let now = sut.now;
                (
                    None,
                    sut.apply(&Command::ExpireHolds {
                        family_id: "fam".into(),
                        up_to_ms: now,
                    }),
                )
            }
            Transition::Alarm(raised) => {
                // ExpireHolds still applies while the alarm is raised.
                sut.no_space = *raised;
                let now = sut.now;
                (
                    None,
                    sut.apply(&Command::ExpireHolds {
                        family_id: "fam".into(),
                        up_to_ms: now,
                    }),
                )
            }
        };
        let got = observed(&result);
        let expect_plain = match &expect {
            Expect::FailedAfterExpiry(code) => Expect::Failed(*code),
            other => other.clone(),
        };
        assert_eq!(
            got, expect_plain,
            "step {transition:?}: ledger answered {result:?}"
        );

        // Errors change nothing, but for the expiry of a touched hold.
        if result.is_err() && !matches!(expect, Expect::FailedAfterExpiry(_)) {
            assert_eq!(
                digest_before,
                sut.family.digest(),
                "an error changed state: {result:?}"
            );
        }
        // Invariant 7: a replay never changes the answer's index and appends nothing.
        if let (Some(Command::Apply(cmd)), Ok(decision)) = (&command, &result) {
            let id = cmd.header.event_id.to_string();
            match sut.first_index.get(&id) {
                Some(first) => {
                    assert!(decision.replayed, "second answer for {id} is not a replay");
                    assert_eq!(
                        &decision.commit_index, first,
                        "replay of {id} moved its index"
                    );
                    assert_eq!(
                        sut.family.journal_len(),
                        journal_before,
                        "replay of {id} appended"
                    );
                }
                None => {
                    sut.first_index.insert(id, decision.commit_index);
                }
            }
        }
        // Invariant 3: one capture owner per hold, ever.
        if let Ok(Decision { outcome, .. }) = &result {
            match outcome {
                Outcome::Captured {
                    hold_id,
                    attempt_id,
                } => {
                    let previous = sut
                        .capture_owner
                        .insert(hold_id.to_string(), attempt_id.clone());
                    assert!(previous.is_none(), "hold {hold_id} captured twice");
                }
                Outcome::AlreadyCaptured {
                    hold_id,
                    owner_attempt_id,
                    ..
                } => {
                    assert_eq!(
                        sut.capture_owner.get(hold_id.as_str()),
                        Some(owner_attempt_id)
                    );
                }
                _ => {}
            }
        }
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        // Invariants 1, 2 and 5 (folds, limits, conservation).
        let violations = sut.family.invariant_violations();
        assert!(violations.is_empty(), "{violations:?}");
        // The model's fold of every account matches the ledger's rows.
        for (name, expected) in &model.accounts {
            let row = sut
                .family
                .get_usage(&AccountKey::new(*name, 0))
                .map(|u| u.account);
            let got = row.map(|a| AccountM {
                count: a.invocation_count,
                reserved: a.reserved_invocations,
                captured: a.captured_invocations,
                legacy_count: a.legacy_unheld.count,
                legacy_exposed: a.legacy_unheld.exposed_units,
                exposed: a.total_cost_exposed_units,
                realized: a.total_cost_realized_spend_units,
            });
            assert_eq!(got.as_ref(), Some(expected), "account {name}");
        }
        // Invariant 4: one terminal state per hold, never back to Authorized.
        for hold in 0..HOLDS {
            let Some(states) = sut
                .family
                .get_hold(&HoldId::from(format!("h{hold}")))
                .and_then(|v| v.states())
            else {
                continue;
            };
            let model_state = model.live(hold).map(|h| h.inv);
            let expected = match model_state {
                Some(Inv::Authorized) => InvocationState::Authorized,
                Some(Inv::Captured) => InvocationState::Captured,
                Some(Inv::Reversed) => InvocationState::Reversed,
                None => panic!("ledger has hold h{hold}, the model does not"),
            };
            assert_eq!(states.invocation, expected, "hold h{hold}");
        }
        // The rows out of memory are exactly what the family counted and digested.
        assert_eq!(sut.cold.meta(), sut.family.cold_meta());
        // Snapshots round-trip byte-identically.
        let bytes = sut.family.to_snapshot_bytes();
        let back = Family::from_snapshot_bytes(&bytes).expect("decodes");
        assert_eq!(back.to_snapshot_bytes(), bytes);
        // Replicas converge: the same commands give the same bytes.
        assert_eq!(
            sut.replica.to_snapshot_bytes(),
            bytes,
            "the replica's state"
        );
    }
}

prop_state_machine! {
    #![proptest_config(Config { cases: 192, max_shrink_iters: 4_096, ..Config::default() })]

    #[test]
    fn ledger_agrees_with_the_reference_model(sequential 1..80 => LedgerUnderTest);
}
