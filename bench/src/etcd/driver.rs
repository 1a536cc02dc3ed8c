//! The etcd side's load: closed-loop callers doing authorize + capture + reconcile on the
//! scheme of [`super`], the client's batcher (one `Txn` for many steps, never two `Txn`s in
//! flight on one account), retry on conflict, and the counters the report prints.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::Rng;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

use super::pb::etcdserverpb::kv_client::KvClient;
use super::pb::etcdserverpb::{
    compare, request_op, response_op, Compare, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use super::scheme::{self, Account, Hold, Limits, Outcome, Step};

/// The bench's capability and grant, as Tally's bench names them.
const CAPABILITY: &str = "bench-cap";
/// A step that conflicts this many times in a row gives up (never seen: a hint of a bug).
const MAX_ROUNDS: u32 = 1_000;
/// A `Txn` that fails on the wire this many times gives up (the cluster is down).
const MAX_WIRE_FAILURES: u32 = 10;
/// Most steps in one `Txn`: 64 steps on 64 accounts are 128 compares and 128 puts, etcd's
/// default `--max-txn-ops`.
pub const MAX_STEPS_PER_TXN: usize = 64;
/// How long the first step of a batch waits for company (Tally's `BatchConfig` default).
const LINGER: Duration = Duration::from_millis(1);

/// One load: how many callers, for how long, on how many families, how hot.
#[derive(Clone, Debug)]
pub struct Load {
    /// Family names are `{prefix}{n}`: Tally's bench uses `bench-family-`.
    pub prefix: &'static str,
    pub families: u64,
    pub hot_share: f64,
    pub callers: usize,
    /// Most steps per `Txn` (1: a `Txn` per step).
    pub max_batch: usize,
    pub duration: Duration,
}

/// What one load measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub callers: usize,
    pub max_batch: usize,
    pub hot_share: f64,
    pub seconds: f64,
    /// Tool calls done (all three steps decided).
    pub calls: u64,
    pub calls_per_s: f64,
    /// Steps decided (three a call): Tally's "commands".
    pub steps: u64,
    pub steps_per_s: f64,
    pub call_p50_ms: f64,
    pub call_p99_ms: f64,
    pub step_p50_ms: f64,
    pub step_p99_ms: f64,
    /// `Txn`s sent, whatever their answer.
    pub txns: u64,
    /// `Txn`s whose compare failed (a lost race or a stale cache): each was re-planned from the
    /// values its else branch returned and sent again.
    pub conflicts: u64,
    /// `Txn`s that failed on the wire and were sent again.
    pub rpc_errors: u64,
    /// Steps recognised as already applied (not counted twice).
    pub replays: u64,
    /// Steps carried per `Txn` (1.0: no batching happened).
    pub steps_per_txn: f64,
    /// Calls abandoned on an error (the first error is in `first_error`).
    pub failed_calls: u64,
    pub first_error: Option<String>,
}

/// Every account summed: after complete calls, invocations = calls, exposed = 0 and
/// realized = 60 x calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    pub accounts: u64,
    pub invocations: u64,
    pub exposed_units: u64,
    pub realized_units: u64,
}

/// Units one call realizes (of the 100 it exposes).
pub const REALIZED_PER_CALL: u64 = 60;

/// The client: a connection to the leader and the batcher task, which keeps what this
/// client last saw of each account across loads, as a long-lived client would.
pub struct Etcd {
    kv: KvClient<Channel>,
    steps: mpsc::UnboundedSender<Pending>,
    max_batch: Arc<AtomicUsize>,
}

/// What this client knows of a key: the revision it last saw (0: absent, or never seen) and
/// the value then.
#[derive(Clone, Debug, PartialEq)]
struct Seen<T> {
    rev: i64,
    value: Option<T>,
}

impl<T> Default for Seen<T> {
    fn default() -> Self {
        Self {
            rev: 0,
            value: None,
        }
    }
}

enum StepKind {
    Authorize {
        requested: u64,
        limits: Limits,
        expires_at_ms: u64,
    },
    Capture {
        attempt: String,
    },
    Reconcile {
        exposed: u64,
        realized: u64,
    },
}

/// A step waiting for its `Txn`. A capture names no account (it writes the hold alone).
struct Pending {
    account: Option<Vec<u8>>,
    kind: StepKind,
    hold_key: Vec<u8>,
    hold: Seen<Hold>,
    reply: oneshot::Sender<Result<Done, String>>,
    stats: Arc<Stats>,
}

/// A decided step: its outcome and the hold as it now stands.
struct Done {
    outcome: Outcome,
    hold: Seen<Hold>,
}

#[derive(Default)]
struct Stats {
    calls: AtomicU64,
    steps: AtomicU64,
    txns: AtomicU64,
    conflicts: AtomicU64,
    rpc_errors: AtomicU64,
    replays: AtomicU64,
    txn_steps: AtomicU64,
    failed_calls: AtomicU64,
    first_error: Mutex<Option<String>>,
    step_latency: Mutex<Option<Histogram<u64>>>,
    call_latency: Mutex<Option<Histogram<u64>>>,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn record(histogram: &Mutex<Option<Histogram<u64>>>, since: Instant) {
    let micros = since.elapsed().as_micros() as u64;
    let mut guard = histogram.lock().unwrap_or_else(|p| p.into_inner());
    let h = guard.get_or_insert_with(|| {
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
    });
    let _ = h.record(micros.max(1));
}

fn quantile_ms(histogram: &Mutex<Option<Histogram<u64>>>, q: f64) -> f64 {
    let guard = histogram.lock().unwrap_or_else(|p| p.into_inner());
    guard
        .as_ref()
        .map_or(0.0, |h| h.value_at_quantile(q) as f64 / 1_000.0)
}

/// Compare `key`'s revision with what was seen: `create_revision == 0` for "absent".
fn compare_seen(key: &[u8], rev: i64) -> Compare {
    let (target, union) = if rev == 0 {
        (
            compare::CompareTarget::Create,
            compare::TargetUnion::CreateRevision(0),
        )
    } else {
        (
            compare::CompareTarget::Mod,
            compare::TargetUnion::ModRevision(rev),
        )
    };
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: target as i32,
        key: key.to_vec(),
        target_union: Some(union),
    }
}

fn put(key: &[u8], value: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.to_vec(),
            value,
            ..PutRequest::default()
        })),
    }
}

fn range(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.to_vec(),
            ..RangeRequest::default()
        })),
    }
}

/// A key read back by a failed `Txn`'s else branch.
fn seen_from<T>(
    response: Option<super::pb::etcdserverpb::ResponseOp>,
    decode: fn(&[u8]) -> Result<T, scheme::StepError>,
) -> Result<Seen<T>, String> {
    let Some(response_op::Response::ResponseRange(range)) = response.and_then(|r| r.response)
    else {
        return Err("a failed Txn did not return its reads".into());
    };
    match range.kvs.into_iter().next() {
        None => Ok(Seen {
            rev: 0,
            value: None,
        }),
        Some(kv) => Ok(Seen {
            rev: kv.mod_revision,
            value: Some(decode(&kv.value).map_err(|e| e.to_string())?),
        }),
    }
}

fn revision(response: &super::pb::etcdserverpb::TxnResponse) -> i64 {
    response.header.as_ref().map_or(0, |h| h.revision)
}

/// After the `failures`th failure on the wire: 20 ms, 40 ms, ... (a leader change takes ~1 s).
async fn backoff(failures: u32) {
    tokio::time::sleep(Duration::from_millis(u64::from(failures) * 20)).await;
}

impl Etcd {
    pub fn new(channel: Channel) -> Arc<Self> {
        let kv = KvClient::new(channel);
        let (steps, queue) = mpsc::unbounded_channel();
        let max_batch = Arc::new(AtomicUsize::new(1));
        tokio::spawn(batcher(kv.clone(), max_batch.clone(), queue));
        Arc::new(Self {
            kv,
            steps,
            max_batch,
        })
    }

    /// Median of `samples` sequential serializable `Range`s of one absent key: the loopback
    /// gRPC round trip to etcd, with no Raft and no disk in it.
    pub async fn round_trip_p50_ms(&self, samples: usize) -> anyhow::Result<f64> {
        crate::round_trip::sequential_p50_ms(samples, || {
            let mut kv = self.kv.clone();
            async move {
                kv.range(RangeRequest {
                    key: b"tb/probe".to_vec(),
                    serializable: true,
                    ..RangeRequest::default()
                })
                .await
            }
        })
        .await
    }

    /// Sums every account this scheme wrote, read in one linearizable `Range`.
    pub async fn account_totals(&self) -> anyhow::Result<Totals> {
        let response = self
            .kv
            .clone()
            .range(RangeRequest {
                key: b"tb/a/".to_vec(),
                // The prefix's end: "tb/a/" with its last byte plus one.
                range_end: b"tb/a0".to_vec(),
                ..RangeRequest::default()
            })
            .await?
            .into_inner();
        let mut totals = Totals::default();
        for kv in response.kvs {
            let account = Account::decode(&kv.value).map_err(|e| anyhow::anyhow!("{e}"))?;
            totals.accounts += 1;
            totals.invocations += u64::from(account.invocation_count);
            totals.exposed_units += account.exposed_units;
            totals.realized_units += account.realized_units;
        }
        Ok(totals)
    }

    /// Runs `load` and measures it.
    pub async fn drive(self: &Arc<Self>, load: &Load) -> Report {
        self.max_batch.store(
            load.max_batch.clamp(1, MAX_STEPS_PER_TXN),
            Ordering::Relaxed,
        );
        let stats = Arc::new(Stats::default());
        let start = Instant::now();
        let deadline = start + load.duration;
        let workers: Vec<_> = (0..load.callers)
            .map(|worker| {
                let (etcd, stats, load) = (self.clone(), stats.clone(), load.clone());
                tokio::spawn(async move {
                    while Instant::now() < deadline {
                        etcd.tool_call(worker, &load, &stats).await;
                    }
                })
            })
            .collect();
        for worker in workers {
            let _ = worker.await;
        }
        let seconds = start.elapsed().as_secs_f64();
        let load_stat = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let calls = load_stat(&stats.calls);
        let steps = load_stat(&stats.steps);
        let first_error = stats
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Report {
            callers: load.callers,
            max_batch: load.max_batch,
            hot_share: load.hot_share,
            seconds,
            calls,
            calls_per_s: calls as f64 / seconds,
            steps,
            steps_per_s: steps as f64 / seconds,
            call_p50_ms: quantile_ms(&stats.call_latency, 0.5),
            call_p99_ms: quantile_ms(&stats.call_latency, 0.99),
            step_p50_ms: quantile_ms(&stats.step_latency, 0.5),
            step_p99_ms: quantile_ms(&stats.step_latency, 0.99),
            txns: load_stat(&stats.txns),
            conflicts: load_stat(&stats.conflicts),
            rpc_errors: load_stat(&stats.rpc_errors),
            replays: load_stat(&stats.replays),
            steps_per_txn: load_stat(&stats.txn_steps) as f64
                / load_stat(&stats.txns).max(1) as f64,
            failed_calls: load_stat(&stats.failed_calls),
            first_error,
        }
    }

    /// One tool call: the family as Tally's bench picks it (family 0 with `hot_share`, else
    /// uniform), a fresh hold named as the kernel names it, then the three steps.
    async fn tool_call(self: &Arc<Self>, worker: usize, load: &Load, stats: &Arc<Stats>) {
        let family = if rand::rng().random_bool(load.hot_share) {
            0
        } else {
            rand::rng().random_range(0..load.families)
        };
        let family = format!("{}{family}", load.prefix);
        let request: u128 = rand::rng().random();
        let hold_id = format!("budget-hold:{request:032x}:{CAPABILITY}:0");
        let account_key = scheme::account_key(&family, CAPABILITY, 0);
        let hold_key = scheme::hold_key(&family, &hold_id);
        let began = Instant::now();
        let fail = |error: String| {
            bump(&stats.failed_calls);
            let mut first = stats.first_error.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert(error);
        };

        let step_began = Instant::now();
        let authorize = StepKind::Authorize {
            requested: 100,
            limits: Limits {
                max_invocations: None,
                max_cost_per_call_units: Some(100),
                max_total_cost_units: None,
                currency: "USD".into(),
            },
            expires_at_ms: tally_client::wall_clock_ms() + 60_000,
        };
        let authorized = self
            .step(
                Some(&account_key),
                authorize,
                &hold_key,
                Seen::default(),
                stats,
            )
            .await;
        record(&stats.step_latency, step_began);
        let authorized = match authorized {
            Ok(done) => done,
            Err(error) => return fail(format!("authorize: {error}")),
        };
        bump(&stats.steps);
        if authorized.outcome != Outcome::Authorized {
            return fail(format!("authorize: {:?}", authorized.outcome));
        }

        let step_began = Instant::now();
        let attempt = format!("attempt-{worker}");
        let captured = self
            .step(
                None,
                StepKind::Capture { attempt },
                &hold_key,
                authorized.hold,
                stats,
            )
            .await;
        record(&stats.step_latency, step_began);
        let captured = match captured {
            Ok(done) => done,
            Err(error) => return fail(format!("capture: {error}")),
        };
        bump(&stats.steps);

        let step_began = Instant::now();
        let reconcile = StepKind::Reconcile {
            exposed: 100,
            realized: REALIZED_PER_CALL,
        };
        let reconciled = self
            .step(
                Some(&account_key),
                reconcile,
                &hold_key,
                captured.hold,
                stats,
            )
            .await;
        record(&stats.step_latency, step_began);
        if let Err(error) = reconciled {
            return fail(format!("reconcile: {error}"));
        }
        bump(&stats.steps);
        record(&stats.call_latency, began);
        bump(&stats.calls);
    }

    /// Hands a step to the batcher and waits for its decision.
    async fn step(
        &self,
        account: Option<&[u8]>,
        kind: StepKind,
        hold_key: &[u8],
        hold: Seen<Hold>,
        stats: &Arc<Stats>,
    ) -> Result<Done, String> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            account: account.map(<[u8]>::to_vec),
            kind,
            hold_key: hold_key.to_vec(),
            hold,
            reply,
            stats: stats.clone(),
        };
        if self.steps.send(pending).is_err() {
            return Err("the batcher is gone".into());
        }
        answer
            .await
            .unwrap_or_else(|_| Err("the batcher dropped the step".into()))
    }
}

/// The batcher's state: steps waiting, accounts with a `Txn` in flight, and the last-seen
/// revision and value of every account.
#[derive(Default)]
struct Queue {
    waiting: VecDeque<Pending>,
    busy: HashSet<Vec<u8>>,
    seen: HashMap<Vec<u8>, Seen<Account>>,
}

/// A batch's accounts as they stand after it: `(key, seen)`.
type Finished = Vec<(Vec<u8>, Seen<Account>)>;

impl Queue {
    fn ready(&self, pending: &Pending) -> bool {
        pending
            .account
            .as_ref()
            .is_none_or(|account| !self.busy.contains(account))
    }

    fn ready_count(&self) -> usize {
        self.waiting.iter().filter(|p| self.ready(p)).count()
    }

    fn finish(&mut self, finished: Finished) {
        for (account, seen) in finished {
            self.busy.remove(&account);
            self.seen.insert(account, seen);
        }
    }

    /// Takes up to `max` ready steps in queue order (so one account's steps keep their
    /// order), one per hold (etcd refuses a `Txn` that puts a key twice), and marks their
    /// accounts busy until the `Txn` is answered.
    fn form(&mut self, max: usize) -> Option<(Vec<Pending>, Finished)> {
        let mut batch = Vec::new();
        let mut accounts: Vec<Vec<u8>> = Vec::new();
        let mut holds = HashSet::new();
        let mut rest = VecDeque::with_capacity(self.waiting.len());
        while let Some(pending) = self.waiting.pop_front() {
            if batch.len() < max && self.ready(&pending) && holds.insert(pending.hold_key.clone()) {
                if let Some(account) = &pending.account {
                    if !accounts.contains(account) {
                        accounts.push(account.clone());
                    }
                }
                batch.push(pending);
            } else {
                rest.push_back(pending);
            }
        }
        self.waiting = rest;
        if batch.is_empty() {
            return None;
        }
        let accounts = accounts
            .into_iter()
            .map(|account| {
                self.busy.insert(account.clone());
                let seen = self.seen.get(&account).cloned().unwrap_or_default();
                (account, seen)
            })
            .collect();
        Some((batch, accounts))
    }
}

/// Collects steps into `Txn`s as Tally's `BatchingClient` collects commands (the first waits
/// up to 1 ms for company, unless `max_batch` is 1), sends as many as are ready, never two on
/// one account at once.
async fn batcher(
    kv: KvClient<Channel>,
    max_batch: Arc<AtomicUsize>,
    mut steps: mpsc::UnboundedReceiver<Pending>,
) {
    let (finished_tx, mut finished_rx) = mpsc::unbounded_channel::<Finished>();
    let mut queue = Queue::default();
    loop {
        tokio::select! {
            step = steps.recv() => match step {
                Some(step) => queue.waiting.push_back(step),
                None => return,
            },
            Some(finished) = finished_rx.recv() => queue.finish(finished),
        }
        let max = max_batch.load(Ordering::Relaxed);
        if max > 1 && queue.ready_count() < max {
            let linger = tokio::time::sleep(LINGER);
            tokio::pin!(linger);
            loop {
                tokio::select! {
                    step = steps.recv() => match step {
                        Some(step) => {
                            queue.waiting.push_back(step);
                            if queue.ready_count() >= max {
                                break;
                            }
                        }
                        None => return,
                    },
                    Some(finished) = finished_rx.recv() => queue.finish(finished),
                    _ = &mut linger => break,
                }
            }
        }
        while let Some((batch, accounts)) = queue.form(max) {
            let (kv, finished_tx) = (kv.clone(), finished_tx.clone());
            tokio::spawn(async move {
                let _ = finished_tx.send(run_batch(kv, batch, accounts).await);
            });
        }
    }
}

/// Decides and writes `batch` in one `Txn`, re-planning from the else branch's reads until
/// every step is decided. Returns the batch's accounts as now known.
async fn run_batch(
    kv: KvClient<Channel>,
    mut batch: Vec<Pending>,
    mut accounts: Finished,
) -> Finished {
    let stats = batch[0].stats.clone();
    let index = |key: &Option<Vec<u8>>| key.as_ref().map(|key| accounts_position(&accounts, key));
    let positions: Vec<Option<usize>> = batch.iter().map(|p| index(&p.account)).collect();
    let mut batch: Vec<(Pending, Option<usize>)> = batch.drain(..).zip(positions).collect();
    let mut wire_failures = 0;
    for _ in 0..MAX_ROUNDS {
        // Plan every step in queue order on working copies of its account.
        let mut working: Vec<Option<Account>> = accounts
            .iter()
            .map(|(_, seen)| seen.value.clone())
            .collect();
        let mut plans: Vec<(Pending, Option<usize>, Hold, Outcome)> =
            Vec::with_capacity(batch.len());
        for (pending, at) in batch.drain(..) {
            let account = at.and_then(|at| working[at].as_ref());
            let step = match &pending.kind {
                StepKind::Authorize {
                    requested,
                    limits,
                    expires_at_ms,
                } => scheme::authorize(
                    account,
                    pending.hold.value.as_ref(),
                    *requested,
                    limits,
                    *expires_at_ms,
                ),
                StepKind::Capture { attempt } => scheme::capture(
                    pending.hold.value.as_ref(),
                    attempt,
                    tally_client::wall_clock_ms(),
                ),
                StepKind::Reconcile { exposed, realized } => {
                    scheme::reconcile(account, pending.hold.value.as_ref(), *exposed, *realized)
                }
            };
            match step {
                Err(error) => {
                    let _ = pending.reply.send(Err(error.to_string()));
                }
                Ok(Step::Replay(outcome)) => {
                    bump(&stats.replays);
                    let hold = pending.hold.clone();
                    let _ = pending.reply.send(Ok(Done { outcome, hold }));
                }
                Ok(Step::Write {
                    account,
                    hold,
                    outcome,
                }) => {
                    if let (Some(next), Some(at)) = (account, at) {
                        working[at] = Some(next);
                    }
                    plans.push((pending, at, hold, outcome));
                }
            }
        }
        if plans.is_empty() {
            return accounts;
        }
        // Compare (and read back on failure) every account a planned step decided on.
        let mut involved: Vec<usize> = Vec::new();
        for (_, at, _, _) in &plans {
            if let Some(at) = at {
                if !involved.contains(at) {
                    involved.push(*at);
                }
            }
        }
        let ops = involved.len() + plans.len();
        let mut txn = TxnRequest {
            compare: Vec::with_capacity(ops),
            success: Vec::with_capacity(ops),
            failure: Vec::with_capacity(ops),
        };
        for &at in &involved {
            let (key, seen) = &accounts[at];
            txn.compare.push(compare_seen(key, seen.rev));
            txn.failure.push(range(key));
            if working[at] != seen.value {
                if let Some(next) = &working[at] {
                    txn.success.push(put(key, next.encode()));
                }
            }
        }
        for (pending, _, hold, _) in &plans {
            txn.compare
                .push(compare_seen(&pending.hold_key, pending.hold.rev));
            txn.success.push(put(&pending.hold_key, hold.encode()));
            txn.failure.push(range(&pending.hold_key));
        }
        bump(&stats.txns);
        stats
            .txn_steps
            .fetch_add(plans.len() as u64, Ordering::Relaxed);
        match kv.clone().txn(txn).await {
            Ok(response) if response.get_ref().succeeded => {
                let rev = revision(response.get_ref());
                for &at in &involved {
                    if working[at] != accounts[at].1.value {
                        accounts[at].1 = Seen {
                            rev,
                            value: working[at].take(),
                        };
                    }
                }
                for (pending, _, hold, outcome) in plans {
                    let hold = Seen {
                        rev,
                        value: Some(hold),
                    };
                    let _ = pending.reply.send(Ok(Done { outcome, hold }));
                }
                return accounts;
            }
            Ok(response) => {
                bump(&stats.conflicts);
                let mut reads = response.into_inner().responses.into_iter();
                let read = (|| {
                    let mut seen_accounts = Vec::with_capacity(involved.len());
                    for _ in &involved {
                        seen_accounts.push(seen_from(reads.next(), Account::decode)?);
                    }
                    let mut holds = Vec::with_capacity(plans.len());
                    for _ in &plans {
                        holds.push(seen_from(reads.next(), Hold::decode)?);
                    }
                    Ok::<_, String>((seen_accounts, holds))
                })();
                match read {
                    Ok((seen_accounts, holds)) => {
                        for (&at, seen) in involved.iter().zip(seen_accounts) {
                            accounts[at].1 = seen;
                        }
                        for ((mut pending, at, _, _), hold) in plans.into_iter().zip(holds) {
                            pending.hold = hold;
                            batch.push((pending, at));
                        }
                    }
                    Err(error) => {
                        for (pending, _, _, _) in plans {
                            let _ = pending.reply.send(Err(error.clone()));
                        }
                        // Forget what we thought we knew: the next Txn learns it again.
                        for (_, seen) in &mut accounts {
                            *seen = Seen::default();
                        }
                        return accounts;
                    }
                }
            }
            Err(status) => {
                // Ambiguous: it may have applied. Sending the same compares again is safe: if
                // it applied they fail, and the else branch shows the holds written.
                bump(&stats.rpc_errors);
                batch.extend(plans.into_iter().map(|(pending, at, _, _)| (pending, at)));
                wire_failures += 1;
                if wire_failures == MAX_WIRE_FAILURES {
                    for (pending, _) in batch {
                        let _ = pending.reply.send(Err(status.to_string()));
                    }
                    return accounts;
                }
                backoff(wire_failures).await;
            }
        }
    }
    for (pending, _) in batch {
        let _ = pending
            .reply
            .send(Err(format!("no decision after {MAX_ROUNDS} rounds")));
    }
    accounts
}

fn accounts_position(accounts: &Finished, key: &[u8]) -> usize {
    accounts
        .iter()
        .position(|(account, _)| account == key)
        .expect("every step's account is in its batch")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(
        account: Option<&str>,
        hold: &str,
    ) -> (Pending, oneshot::Receiver<Result<Done, String>>) {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            account: account.map(|a| a.as_bytes().to_vec()),
            kind: StepKind::Capture {
                attempt: "a".into(),
            },
            hold_key: hold.as_bytes().to_vec(),
            hold: Seen::default(),
            reply,
            stats: Arc::new(Stats::default()),
        };
        (pending, answer)
    }

    fn holds(batch: &[Pending]) -> Vec<&[u8]> {
        batch.iter().map(|p| p.hold_key.as_slice()).collect()
    }

    #[test]
    fn a_batch_skips_busy_accounts_and_repeated_holds_and_keeps_queue_order() {
        let mut queue = Queue::default();
        let mut answers = Vec::new();
        for (account, hold) in [
            (Some("A"), "h1"),
            (Some("B"), "h2"),
            (Some("A"), "h3"),
            (None, "h4"),
            (Some("C"), "h1"),
            (Some("B"), "h5"),
        ] {
            let (p, answer) = pending(account, hold);
            queue.waiting.push_back(p);
            answers.push(answer);
        }
        queue.busy.insert(b"B".to_vec());
        queue.seen.insert(
            b"A".to_vec(),
            Seen {
                rev: 7,
                value: None,
            },
        );
        let (batch, accounts) = queue.form(64).expect("ready steps");
        // B is in flight; the second step on hold h1 waits for the next Txn.
        assert_eq!(holds(&batch), [&b"h1"[..], b"h3", b"h4"]);
        assert_eq!(accounts.len(), 1, "A once, however many of its steps");
        assert_eq!(accounts[0].1.rev, 7, "with what was last seen of it");
        assert!(queue.busy.contains(&b"A"[..]), "A is now in flight");
        let waiting: Vec<&[u8]> = queue
            .waiting
            .iter()
            .map(|p| p.hold_key.as_slice())
            .collect();
        assert_eq!(waiting, [&b"h2"[..], b"h1", b"h5"]);
        assert!(queue
            .form(64)
            .is_some_and(|(batch, _)| holds(&batch) == [&b"h1"[..]]));
        queue.finish(vec![(b"B".to_vec(), Seen::default())]);
        let (batch, _) = queue.form(1).expect("B is free again");
        assert_eq!(holds(&batch), [&b"h2"[..]], "at most the batch size");
        assert_eq!(queue.ready_count(), 0, "B's next step waits for its first");
    }
}
