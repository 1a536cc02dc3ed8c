//! A family driven like a replica would drive it: one command per log entry, cluster time
//! under the test's control, and builders for every command.
#![allow(dead_code)]

use tally_ledger::*;

pub const T0: u64 = 1_700_000_000_000;
pub const CAP: &str = "cap-1";

pub fn usd(max_invocations: Option<u32>, per_call: Option<u64>, total: Option<u64>) -> GrantLimits {
    GrantLimits::monetary(max_invocations, per_call, total, "USD")
}

/// The seed's usual grant: 10 calls, at most 100 a call, 1000 in all.
pub fn limits() -> GrantLimits {
    usd(Some(10), Some(100), Some(1_000))
}

pub struct Harness {
    pub family: Family,
    pub log_index: u64,
    pub now_ms: u64,
    pub params: ClusterParams,
    /// Whether the `NoSpace` alarm is raised (docs/spec.md §5.6).
    pub no_space: bool,
    /// The family's rows out of memory, as a node's store would keep them.
    pub cold: ColdRowsInMemory,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Self {
            family: Family::new(FamilyId::from("fam")),
            log_index: 0,
            now_ms: T0,
            params: ClusterParams::default(),
            no_space: false,
            cold: ColdRowsInMemory::default(),
        }
    }

    pub fn ctx(&mut self) -> ApplyCtx {
        self.log_index += 1;
        ApplyCtx {
            log_id: LogPosition {
                term: 1,
                index: self.log_index,
            },
            command_position: 0,
            now_ms: self.now_ms,
            params: self.params,
            no_space: self.no_space,
        }
    }

    pub fn apply(&mut self, command: Command) -> Result<Decision, LedgerError> {
        let ctx = self.ctx();
        let result = self.cold.apply(&mut self.family, &command, &ctx);
        let violations = self.family.invariant_violations();
        assert!(
            violations.is_empty(),
            "invariants broken after {command:?}: {violations:?}"
        );
        result
    }

    pub fn ok(&mut self, command: Command) -> Decision {
        let name = command.name();
        self.apply(command)
            .unwrap_or_else(|err| panic!("{name} failed: {err}"))
    }

    pub fn err(&mut self, command: Command) -> LedgerError {
        let name = command.name();
        match self.apply(command) {
            Ok(decision) => panic!("{name} unexpectedly succeeded: {decision:?}"),
            Err(err) => err,
        }
    }

    /// Applies `command` expecting an error that changes nothing at all.
    pub fn err_unchanged(&mut self, command: Command) -> LedgerError {
        let before = self.family.digest();
        let err = self.err(command);
        assert_eq!(
            before,
            self.family.digest(),
            "an error changed state: {err}"
        );
        err
    }

    /// Applies `command` at `ctx` as a node would (looking up its rows out of memory), with
    /// no invariant sweep.
    pub fn apply_at(&mut self, command: &Command, ctx: &ApplyCtx) -> Result<Decision, LedgerError> {
        self.cold.apply(&mut self.family, command, ctx)
    }

    pub fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
    }

    pub fn usage(&self, capability_id: &str, grant_index: u32) -> Account {
        self.family
            .get_usage(&AccountKey::new(capability_id, grant_index))
            .unwrap_or_else(|| panic!("no usage row for {capability_id}/{grant_index}"))
            .account
    }

    pub fn counts(&self, capability_id: &str, grant_index: u32) -> (u32, u64) {
        let account = self.usage(capability_id, grant_index);
        (
            account.invocation_count,
            account.committed_cost_units().expect("no overflow"),
        )
    }

    pub fn events(&self) -> Vec<EventRecord> {
        self.family.list_events(None, None, None, 10_000)
    }

    pub fn kinds(&self) -> Vec<&'static str> {
        self.events().iter().map(|e| e.kind.as_str()).collect()
    }

    pub fn hold(&self, hold_id: &str) -> Hold {
        match self.family.get_hold(&HoldId::from(hold_id)) {
            Some(HoldView::Live(hold)) => hold,
            other => panic!("hold {hold_id} is not live: {other:?}"),
        }
    }

    pub fn header(&self, event_id: &str) -> CommandHeader {
        self.header_on(CAP, 0, event_id)
    }

    pub fn header_on(
        &self,
        capability_id: &str,
        grant_index: u32,
        event_id: &str,
    ) -> CommandHeader {
        CommandHeader {
            family_id: FamilyId::from("fam"),
            capability_id: CapabilityId::from(capability_id),
            grant_index,
            event_id: EventId::from(event_id),
            not_after_ms: self.now_ms + 60_000,
        }
    }

    pub fn on(&self, header: CommandHeader, op: Operation) -> Command {
        Command::Apply(ClientCommand { header, op })
    }

    pub fn authorize(&self, hold_id: &str, units: u64) -> Command {
        self.authorize_with(hold_id, units, limits(), vec![], None)
    }

    pub fn authorize_with(
        &self,
        hold_id: &str,
        units: u64,
        limits: GrantLimits,
        ancestors: Vec<AncestorAccount>,
        hold_timeout_ms: Option<u64>,
    ) -> Command {
        self.on(
            self.header(&format!("{hold_id}:authorize")),
            Operation::AuthorizeHold {
                hold_id: HoldId::from(hold_id),
                requested_exposure_units: units,
                limits,
                ancestors,
                hold_timeout_ms,
            },
        )
    }

    pub fn capture(&self, hold_id: &str, attempt_id: &str) -> Command {
        self.on(
            self.header(&format!("{hold_id}:capture")),
            Operation::CaptureInvocation {
                hold_id: HoldId::from(hold_id),
                attempt_id: AttemptId::from(attempt_id),
            },
        )
    }

    pub fn cancel(&self, hold_id: &str) -> Command {
        self.on(
            self.header(&format!("{hold_id}:cancel")),
            Operation::CancelCapturedBeforeDispatch {
                hold_id: HoldId::from(hold_id),
            },
        )
    }

    pub fn reverse(&self, hold_id: &str, exposure_units: u64) -> Command {
        self.on(
            self.header(&format!("{hold_id}:reverse")),
            Operation::ReverseHold {
                hold_id: HoldId::from(hold_id),
                exposure_units,
            },
        )
    }

    pub fn release(&self, hold_id: &str, event: &str, units: u64) -> Command {
        self.on(
            self.header(event),
            Operation::ReleaseHold {
                hold_id: HoldId::from(hold_id),
                released_exposure_units: units,
            },
        )
    }

    pub fn reconcile(&self, hold_id: &str, exposed: u64, realized: u64) -> Command {
        self.on(
            self.header(&format!("{hold_id}:reconcile")),
            Operation::ReconcileHold {
                hold_id: HoldId::from(hold_id),
                exposed_cost_units: exposed,
                realized_spend_units: realized,
            },
        )
    }

    pub fn nonce(&self, event: &str, nonce_id: &str, expires_at_ms: u64) -> Command {
        self.on(
            self.header(event),
            Operation::ConsumeNonce {
                nonce_id: NonceId::from(nonce_id),
                expires_at_ms,
            },
        )
    }

    pub fn resolve(&self, command: &Command) -> Command {
        match command {
            Command::Apply(cmd) => Command::Resolve(cmd.clone()),
            other => panic!("only client commands resolve: {other:?}"),
        }
    }

    pub fn expire(&self, up_to_ms: u64) -> Command {
        Command::ExpireHolds {
            family_id: FamilyId::from("fam"),
            up_to_ms,
        }
    }
}

pub fn ancestor(capability_id: &str, grant_index: u32, limits: GrantLimits) -> AncestorAccount {
    AncestorAccount {
        account: AccountKey::new(capability_id, grant_index),
        limits,
    }
}

pub fn code(err: &LedgerError) -> PreconditionCode {
    err.precondition_code()
        .unwrap_or_else(|| panic!("not a precondition failure: {err:?}"))
}
