//! The seeded workload: kernel-like request flows through tally-client against the proxies.
//! Many families and one hot one; delegated children that reserve on a shared parent
//! (`AncestorAccount`); legacy charges, increments and nonces; and pairs of client instances
//! sending identical requests (same event ids) with different attempt ids, of which exactly
//! one may own the capture. A request stops at the first answer that is not a decision:
//! unknowns retain everything (fail-closed) and are resolved at the end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tally_client::{ClientConfig, Outcome, TallyClient, Transport};
use tally_ledger::{
    AccountKey, AncestorAccount, AttemptId, ClientCommand, CommandHeader, EventId, GrantLimits,
    NonceId, Operation, Outcome as Answer,
};

use crate::history::Recorder;

#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub families: usize,
    /// Share of requests that go to family 0, the hot one.
    pub hot_share: f64,
    /// Delegated children per family.
    pub children: usize,
    /// Single-client workers.
    pub workers: usize,
    /// Pairs of client instances sending identical requests.
    pub twin_pairs: usize,
    /// Pause between a worker's requests.
    pub think_ms: u64,
    /// How long after it is built a command may still apply (`not_after_ms` = wall time +
    /// this; cluster time ≈ wall time). With the cluster's retention it sets when an event is
    /// compacted: `not_after_ms + retention_ms`.
    pub not_after_window_ms: u64,
}

/// The accounts of one family: a root grant, delegated children, a legacy account and an
/// invocation-only account.
#[derive(Clone, Debug)]
pub struct FamilySpec {
    pub id: String,
    pub root: AncestorAccount,
    pub children: Vec<AncestorAccount>,
    pub legacy: AncestorAccount,
    pub counter: AncestorAccount,
}

pub fn families(count: usize, children: usize) -> Vec<FamilySpec> {
    (0..count)
        .map(|f| {
            let id = format!("fam-{f}");
            let account = |cap: String, limits: GrantLimits| AncestorAccount {
                account: AccountKey::new(cap, 0),
                limits,
            };
            FamilySpec {
                root: account(
                    format!("{id}-root"),
                    GrantLimits::monetary(Some(400), Some(500), Some(40_000), "USD"),
                ),
                children: (0..children)
                    .map(|c| {
                        account(
                            format!("{id}-child-{c}"),
                            GrantLimits::monetary(Some(150), Some(400), Some(15_000), "USD"),
                        )
                    })
                    .collect(),
                legacy: account(
                    format!("{id}-legacy"),
                    GrantLimits::monetary(Some(300), Some(300), Some(20_000), "USD"),
                ),
                counter: account(format!("{id}-counter"), GrantLimits::invocations(200)),
                id,
            }
        })
        .collect()
}

pub fn client_config(endpoints: Vec<String>, transport: Transport) -> ClientConfig {
    ClientConfig {
        attempt_timeout: Duration::from_millis(1_500),
        // Shorter than most faults, so lost acknowledgements end as unknowns and the
        // liveness phase has to settle them with ResolveEvent.
        retry_for: Duration::from_millis(2_500),
        resolve_for: Duration::from_secs(2),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(400),
        ..ClientConfig::new(endpoints, transport)
    }
}

/// Worker 0's client: a kernel with a tight deadline. It gives up after a few hundred
/// milliseconds, so every outage leaves unknowns for the liveness phase to resolve (some
/// then tombstoned: not applied, never to apply).
pub fn impatient_config(endpoints: Vec<String>, transport: Transport) -> ClientConfig {
    ClientConfig {
        attempt_timeout: Duration::from_millis(400),
        retry_for: Duration::from_millis(300),
        resolve_for: Duration::from_millis(200),
        ..client_config(endpoints, transport)
    }
}

use tally_client::wall_clock_ms as wall_ms;

/// One client instance and the history it writes to.
struct Caller {
    client: TallyClient,
    process: u32,
    recorder: Recorder,
}

impl Caller {
    async fn submit(&self, command: ClientCommand) -> Option<Outcome> {
        if self.recorder.is_full() {
            return None;
        }
        let invoked = self.recorder.now_ms();
        let outcome = self.client.submit(command.clone()).await;
        self.recorder
            .record(self.process, &command, invoked, &outcome)?;
        Some(outcome)
    }
}

fn command(
    family: &str,
    account: &AccountKey,
    event_id: String,
    op: Operation,
    not_after_window_ms: u64,
) -> ClientCommand {
    ClientCommand {
        header: CommandHeader {
            family_id: family.into(),
            capability_id: account.capability_id.clone(),
            grant_index: account.grant_index,
            event_id: EventId::new(event_id),
            not_after_ms: wall_ms() + not_after_window_ms,
        },
        op,
    }
}

/// What one request does after its hold is captured by its own attempt.
#[derive(Clone, Copy, Debug)]
enum Finish {
    Reconcile,
    ReleaseThenReconcile,
    Cancel,
}

/// The fixed part of one hold request, shared by twin clients.
#[derive(Clone, Debug)]
struct HoldPlan {
    family: String,
    not_after_window_ms: u64,
    account: AncestorAccount,
    ancestors: Vec<AncestorAccount>,
    hold_id: String,
    units: u64,
    realized: u64,
    released: u64,
    finish: Finish,
    /// Reverse instead of capturing.
    reverse: bool,
    /// Authorize with a timeout and walk away: expiry reverses it.
    abandon: bool,
}

impl HoldPlan {
    fn random(
        rng: &mut StdRng,
        family: &FamilySpec,
        request_id: &str,
        not_after_window_ms: u64,
    ) -> Self {
        let child = !family.children.is_empty() && rng.random_bool(0.5);
        let (account, ancestors) = if child {
            let c = rng.random_range(0..family.children.len());
            (family.children[c].clone(), vec![family.root.clone()])
        } else {
            (family.root.clone(), Vec::new())
        };
        let units = rng.random_range(1..=450);
        let hold_id = tally_client::ids::hold_id(request_id, &account.account.capability_id, 0)
            .map(|h| h.to_string())
            .unwrap_or_else(|_| format!("budget-hold:{request_id}"));
        let roll = rng.random_range(0..100);
        Self {
            family: family.id.clone(),
            not_after_window_ms,
            account,
            ancestors,
            hold_id,
            units,
            realized: rng.random_range(0..=units),
            released: rng.random_range(1..=units.max(2) - 1).min(units - 1),
            finish: match rng.random_range(0..10) {
                0..=5 => Finish::Reconcile,
                6..=7 => Finish::ReleaseThenReconcile,
                _ => Finish::Cancel,
            },
            reverse: roll < 12,
            abandon: (12..20).contains(&roll),
        }
    }

    fn cmd(&self, event_id: String, op: Operation) -> ClientCommand {
        command(
            &self.family,
            &self.account.account,
            event_id,
            op,
            self.not_after_window_ms,
        )
    }

    fn authorize(&self) -> ClientCommand {
        let hold = self.hold_id.as_str().into();
        self.cmd(
            tally_client::ids::authorize_event(&hold).to_string(),
            Operation::AuthorizeHold {
                hold_id: hold,
                requested_exposure_units: self.units,
                limits: self.account.limits.clone(),
                ancestors: self.ancestors.clone(),
                // Only abandoned holds expire, so the state is still once the workload stops.
                hold_timeout_ms: self.abandon.then_some(1_500),
            },
        )
    }
}

/// Runs one hold request on `caller` with its own `attempt` (docs/spec.md §9's discipline).
async fn run_hold(caller: &Caller, plan: &HoldPlan, attempt: &str) {
    let hold: tally_ledger::HoldId = plan.hold_id.as_str().into();
    let Some(Outcome::Decided(authorized)) = caller.submit(plan.authorize()).await else {
        return;
    };
    let (Answer::Authorized { .. }, Some(index)) = (&authorized.outcome, authorized.commit_index)
    else {
        return;
    };
    if plan.abandon {
        return;
    }
    if plan.reverse {
        let reverse = plan.cmd(
            tally_client::ids::rollback_event(&hold, index).to_string(),
            Operation::ReverseHold {
                hold_id: hold.clone(),
                exposure_units: plan.units,
            },
        );
        caller.submit(reverse).await;
        return;
    }
    let mut remaining = plan.units;
    if matches!(plan.finish, Finish::ReleaseThenReconcile) && plan.released > 0 {
        // Partial release happens before the capture (after it, the fence refuses it).
        let release = plan.cmd(
            format!("{}:release", plan.hold_id),
            Operation::ReleaseHold {
                hold_id: hold.clone(),
                released_exposure_units: plan.released,
            },
        );
        let Some(Outcome::Decided(released)) = caller.submit(release).await else {
            return;
        };
        match released.outcome {
            Answer::Released {
                remaining_units, ..
            } => remaining = remaining_units,
            _ => return,
        }
    }
    let capture = plan.cmd(
        tally_client::ids::capture_event(&hold, index).to_string(),
        Operation::CaptureInvocation {
            hold_id: hold.clone(),
            attempt_id: AttemptId::new(attempt),
        },
    );
    let Some(Outcome::Decided(captured)) = caller.submit(capture).await else {
        return;
    };
    let owner = match &captured.outcome {
        Answer::Captured { attempt_id, .. } => attempt_id.as_str() == attempt,
        Answer::AlreadyCaptured {
            owner_attempt_id, ..
        } => owner_attempt_id.as_str() == attempt,
        _ => false,
    };
    if !owner {
        return; // A twin owns it: denied before any payment.
    }
    if matches!(plan.finish, Finish::Cancel) {
        let cancel = plan.cmd(
            tally_client::ids::cancel_event(&hold, index).to_string(),
            Operation::CancelCapturedBeforeDispatch { hold_id: hold },
        );
        caller.submit(cancel).await;
        return;
    }
    if remaining == 0 {
        return;
    }
    let reconcile = plan.cmd(
        tally_client::ids::reconcile_event(&hold).to_string(),
        Operation::ReconcileHold {
            hold_id: hold,
            exposed_cost_units: remaining,
            realized_spend_units: plan.realized.min(remaining),
        },
    );
    caller.submit(reconcile).await;
}

/// Legacy charges, increments and nonces: commands without holds.
async fn run_other(
    caller: &Caller,
    rng: &mut StdRng,
    family: &FamilySpec,
    request_id: &str,
    not_after_window_ms: u64,
) {
    let roll = rng.random_range(0..3);
    match roll {
        0 => {
            let cost = rng.random_range(1..=300);
            let account = &family.legacy;
            let charge = command(
                &family.id,
                &account.account,
                format!("{request_id}:charge"),
                Operation::TryChargeCost {
                    cost_units: cost,
                    limits: account.limits.clone(),
                },
                not_after_window_ms,
            );
            let Some(Outcome::Decided(d)) = caller.submit(charge).await else {
                return;
            };
            if !matches!(d.outcome, Answer::Charged { .. }) {
                return;
            }
            let op = if rng.random_bool(0.4) {
                Operation::ReverseChargeCost { cost_units: cost }
            } else {
                Operation::SettleChargeCost {
                    exposed_cost_units: cost,
                    realized_spend_units: rng.random_range(0..=cost),
                }
            };
            let undo = command(
                &family.id,
                &account.account,
                format!("{request_id}:settle"),
                op,
                not_after_window_ms,
            );
            caller.submit(undo).await;
        }
        1 => {
            let account = &family.counter;
            let increment = command(
                &family.id,
                &account.account,
                format!("{request_id}:increment"),
                Operation::TryIncrement {
                    limits: account.limits.clone(),
                },
                not_after_window_ms,
            );
            caller.submit(increment).await;
        }
        _ => {
            let nonce = command(
                &family.id,
                &family.root.account,
                format!("{request_id}:nonce"),
                Operation::ConsumeNonce {
                    nonce_id: NonceId::new(format!("nonce-{request_id}")),
                    // Longer than any run's checks: an expiring nonce is maintenance the
                    // leader proposes, and the final reads want a still cluster.
                    expires_at_ms: wall_ms() + 2 * 3_600_000,
                },
                not_after_window_ms,
            );
            caller.submit(nonce).await;
        }
    }
}

fn pick_family<'a>(
    rng: &mut StdRng,
    config: &WorkloadConfig,
    families: &'a [FamilySpec],
) -> &'a FamilySpec {
    if families.len() == 1 || rng.random_bool(config.hot_share.clamp(0.0, 1.0)) {
        &families[0]
    } else {
        &families[rng.random_range(1..families.len())]
    }
}

/// Runs every worker until `stop`; returns when all have finished their last request.
pub async fn run(
    config: WorkloadConfig,
    seed: u64,
    endpoints: Vec<String>,
    transport: Transport,
    recorder: Recorder,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let families = Arc::new(families(config.families.max(1), config.children));
    let mut tasks = tokio::task::JoinSet::new();
    let mut process = 0u32;
    for worker in 0..config.workers {
        process += 1;
        let client_config = if worker == 0 {
            impatient_config(endpoints.clone(), transport.clone())
        } else {
            client_config(endpoints.clone(), transport.clone())
        };
        let caller = Caller {
            client: TallyClient::new(client_config)?,
            process,
            recorder: recorder.clone(),
        };
        let (families, stop, config) = (families.clone(), stop.clone(), config.clone());
        tasks.spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ (0x9e37_79b9 * (worker as u64 + 1)));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) && !caller.recorder.is_full() {
                n += 1;
                let request_id = format!("s{seed}-w{worker}-r{n}");
                let family = pick_family(&mut rng, &config, &families);
                if rng.random_range(0..100) < 75 {
                    let plan =
                        HoldPlan::random(&mut rng, family, &request_id, config.not_after_window_ms);
                    run_hold(&caller, &plan, &format!("attempt-{request_id}")).await;
                } else {
                    run_other(
                        &caller,
                        &mut rng,
                        family,
                        &request_id,
                        config.not_after_window_ms,
                    )
                    .await;
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..=config.think_ms)))
                    .await;
            }
        });
    }
    for pair in 0..config.twin_pairs {
        let a = Caller {
            client: TallyClient::new(client_config(endpoints.clone(), transport.clone()))?,
            process: process + 1,
            recorder: recorder.clone(),
        };
        let b = Caller {
            client: TallyClient::new(client_config(endpoints.clone(), transport.clone()))?,
            process: process + 2,
            recorder: recorder.clone(),
        };
        process += 2;
        let (families, stop, config) = (families.clone(), stop.clone(), config.clone());
        tasks.spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ (0x7f4a_7c15 * (pair as u64 + 1)));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) && !a.recorder.is_full() {
                n += 1;
                let request_id = format!("s{seed}-t{pair}-r{n}");
                let family = pick_family(&mut rng, &config, &families);
                let mut plan =
                    HoldPlan::random(&mut rng, family, &request_id, config.not_after_window_ms);
                plan.reverse = false;
                plan.abandon = false;
                let (attempt_a, attempt_b) = (
                    format!("attempt-{request_id}-a"),
                    format!("attempt-{request_id}-b"),
                );
                tokio::join!(
                    run_hold(&a, &plan, &attempt_a),
                    run_hold(&b, &plan, &attempt_b),
                );
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..=config.think_ms)))
                    .await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done?;
    }
    Ok(())
}

/// The family ids a run uses, for the final reads.
pub fn family_ids(config: &WorkloadConfig) -> Vec<String> {
    families(config.families.max(1), config.children)
        .into_iter()
        .map(|f| f.id)
        .collect()
}
