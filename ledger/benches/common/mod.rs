//! What the ledger's benches share: the commands of one monetary tool call, named as a kernel
//! names them (or by a counter), built before any clock or byte count starts.

use tally_ledger::*;

pub const T0: u64 = 1_700_000_000_000;

fn command(event: String, op: Operation, now_ms: u64) -> Command {
    Command::Apply(ClientCommand {
        header: CommandHeader {
            family_id: "fam".into(),
            capability_id: "cap".into(),
            grant_index: 0,
            event_id: event.into(),
            not_after_ms: now_ms + 1_000,
        },
        op,
    })
}

/// Where a bench's command applies: the next log index, one command per entry.
pub fn ctx_at(log_index: u64, now_ms: u64, params: ClusterParams) -> ApplyCtx {
    ApplyCtx {
        log_id: LogPosition {
            term: 1,
            index: log_index,
        },
        command_position: 0,
        now_ms,
        params,
        no_space: false,
    }
}

/// How the bench names a call's request: a counter (consecutive ids share their path in the
/// family's id-ordered tables, the kindest case) or a random UUID, as kernels name requests.
#[derive(Clone, Copy)]
pub enum RequestIds {
    Sequential,
    Random,
}

impl RequestIds {
    fn request_id(self, n: u64) -> String {
        match self {
            Self::Sequential => format!("req-{n}"),
            Self::Random => {
                let (a, b) = (splitmix64(n), splitmix64(n ^ 0x5851_f42d_4c95_7f2d));
                format!(
                    "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
                    a >> 32,
                    (a >> 16) & 0xffff,
                    a & 0xfff,
                    b >> 48,
                    b & 0xffff_ffff_ffff
                )
            }
        }
    }
}

/// A fixed pseudo-random permutation of `u64`, so runs name the same requests.
fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One authorize that the grant's per-call limit denies (200 units asked, 100 allowed), as an
/// agent retrying against an exhausted budget sends them: it journals its event and claims
/// its `hold_id` without opening a hold.
#[allow(
    dead_code,
    reason = "the memory bench's; the other benches share this module"
)]
pub fn denied_call(ids: RequestIds, n: u64, now_ms: u64) -> [Command; 1] {
    let hold = HoldId::from(format!("budget-hold:{}:cap:0", ids.request_id(n)));
    [command(
        format!("{hold}:authorize"),
        Operation::AuthorizeHold {
            hold_id: hold,
            requested_exposure_units: 200,
            limits: GrantLimits::monetary(None, Some(100), None, "USD"),
            ancestors: vec![],
            hold_timeout_ms: Some(30_000),
        },
        now_ms,
    )]
}

/// The three commands of one monetary tool call, stamped at `now_ms`.
pub fn tool_call(ids: RequestIds, n: u64, now_ms: u64) -> [Command; 3] {
    let hold = HoldId::from(format!("budget-hold:{}:cap:0", ids.request_id(n)));
    let limits = GrantLimits::monetary(None, Some(100), None, "USD");
    [
        command(
            format!("{hold}:authorize"),
            Operation::AuthorizeHold {
                hold_id: hold.clone(),
                requested_exposure_units: 100,
                limits,
                ancestors: vec![],
                hold_timeout_ms: Some(30_000),
            },
            now_ms,
        ),
        command(
            format!("{hold}:capture"),
            Operation::CaptureInvocation {
                hold_id: hold.clone(),
                attempt_id: "attempt".into(),
            },
            now_ms,
        ),
        command(
            format!("{hold}:reconcile"),
            Operation::ReconcileHold {
                hold_id: hold,
                exposed_cost_units: 100,
                realized_spend_units: 60,
            },
            now_ms,
        ),
    ]
}
