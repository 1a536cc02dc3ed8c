//! `tally bench`: a load of authorize + capture + reconcile calls over many families (one of
//! them hot), with a progress line, throughput and latency percentiles. Closed loop by default
//! (each caller starts its next call when the last ends); with `--rate` the calls start on a
//! fixed schedule, so a slow cluster shows as an achieved rate below the offered one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use rand::Rng;
use tally_ledger::{
    BudgetCommitIndex, ClientCommand, CommandHeader, Decision, EventId, FamilyId, GrantLimits,
    HoldId, Operation,
};

use super::output::print_json;
use crate::{ids, BatchConfig, BatchingClient, Outcome, TallyClient};

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Distinct budget families.
    #[arg(long, default_value_t = 1_000)]
    pub families: u64,
    /// Share of calls that go to family 0, the hot one (0.0 to 1.0).
    #[arg(long, default_value_t = 0.1, value_parser = parse_share)]
    pub hot_share: f64,
    /// Share of calls whose authorize asks more than the grant's per-call limit, so that the
    /// cluster denies it (0.0 to 1.0): one command, no capture, as an agent retrying against
    /// an exhausted budget sends them.
    #[arg(long, default_value_t = 0.0, value_parser = parse_share)]
    pub denied_share: f64,
    /// Concurrent callers.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// How long to run.
    #[arg(long, default_value_t = 10)]
    pub duration_s: u64,
    /// Coalesce concurrent calls into Batch requests of up to this many commands (0: unary).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Offer this many commands per second in all (a tool call is 3 commands), started on a
    /// fixed schedule shared by the callers, instead of as fast as they go. Calls a late
    /// cluster could not take in time start late, never skipped: compare the achieved rate.
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Suppress the progress line.
    #[arg(long)]
    pub quiet: bool,
}

/// The highest `--rate`: far above what a cluster commits, low enough that the schedule's
/// step stays above a nanosecond.
pub const MAX_RATE_PER_S: f64 = 10_000_000.0;

/// A share of calls (`--hot-share`, `--denied-share`): within 0..=1.
fn parse_share(text: &str) -> Result<f64, String> {
    let share: f64 = text.parse().map_err(|e| format!("`{text}`: {e}"))?;
    if !(0.0..=1.0).contains(&share) {
        return Err(format!("{share}: a share of calls within 0..=1"));
    }
    Ok(share)
}

/// `--rate`'s parser, for every command that offers a fixed rate.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text.parse().map_err(|e| format!("`{text}`: {e}"))?;
    if !(rate > 0.0 && rate <= MAX_RATE_PER_S) {
        return Err(format!(
            "{rate}: commands per second within (0, {MAX_RATE_PER_S}]"
        ));
    }
    Ok(rate)
}

/// What a bench run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchReport {
    pub calls: u64,
    pub commands: u64,
    pub errors: u64,
    /// The errors by what they were (`refused`, `unavailable`, `not_applied`, `unknown`), with
    /// the first one's message of each kind: a count alone does not say what went wrong.
    pub errors_by_kind: Vec<ErrorKindCount>,
    pub seconds: f64,
    pub commands_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The slowest command that ended in each second of the run (index 0: the first second),
    /// so a script can tell a stall's moment (say, before or after a change it made).
    pub max_ms_by_second: Vec<f64>,
    /// When the load began, in Unix milliseconds: second 0 of `max_ms_by_second`.
    pub started_at_unix_ms: u64,
    pub batch: usize,
    pub concurrency: usize,
    /// The offered commands/s of `--rate`, when the load had one.
    pub offered_commands_per_s: Option<f64>,
}

/// How many commands ended in one kind of error, and the first such error's message.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ErrorKindCount {
    pub kind: &'static str,
    pub count: u64,
    pub first: String,
}

/// The kinds of error a command can end in, in `Meter::errors_by_kind`'s order.
const ERROR_KINDS: [&str; 4] = ["refused", "unavailable", "not_applied", "unknown"];

/// The longest first message kept per kind of error.
const MAX_ERROR_MESSAGE_BYTES: usize = 200;

pub async fn run(client: Arc<TallyClient>, args: BenchArgs, json: bool) -> anyhow::Result<u8> {
    anyhow::ensure!(
        args.families > 0 && args.concurrency > 0,
        "--families and --concurrency must be positive"
    );
    anyhow::ensure!(
        args.batch <= tally_api::MAX_BATCH_COMMANDS,
        "--batch is at most {}",
        tally_api::MAX_BATCH_COMMANDS
    );
    let report = drive(client, &args).await;
    if json {
        print_json(&report);
    } else {
        if let Some(offered) = report.offered_commands_per_s {
            println!(
                "offered {offered:.0} commands/s on a fixed schedule, achieved {:.0}",
                report.commands_per_s
            );
        }
        println!(
            "{} calls ({} commands, {} errors) in {:.1} s: {:.0} commands/s; latency per command p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms{} (batch {}, concurrency {})",
            report.calls, report.commands, report.errors, report.seconds, report.commands_per_s, report.p50_ms,
            report.p99_ms, report.max_ms, slowest_second(&report.max_ms_by_second)
                .map(|second| format!(", ended in second {second} of the run"))
                .unwrap_or_default(),
            report.batch, report.concurrency
        );
        for kind in &report.errors_by_kind {
            println!("  {} {}, the first: {}", kind.count, kind.kind, kind.first);
        }
    }
    Ok(if report.commands == 0 { 1 } else { 0 })
}

/// Runs the load and measures it.
pub async fn drive(client: Arc<TallyClient>, args: &BenchArgs) -> BenchReport {
    drive_counted(client, args, Arc::new(AtomicU64::new(0))).await
}

/// [`drive`], adding each decided command to `decided` as it comes, for a caller that samples
/// the rate while the load runs.
pub async fn drive_counted(
    client: Arc<TallyClient>,
    args: &BenchArgs,
    decided: Arc<AtomicU64>,
) -> BenchReport {
    let batching = (args.batch > 0).then(|| {
        BatchingClient::new(
            client.clone(),
            BatchConfig {
                max_commands: args.batch,
                ..BatchConfig::default()
            },
        )
    });
    let meter = Arc::new(Meter::new(Instant::now(), decided));
    let submitter = Arc::new(Submitter { client, batching });
    let start = meter.start;
    let started_at_unix_ms = crate::wall_clock_ms();
    let deadline = start + Duration::from_secs(args.duration_s);
    let schedule = args.rate.map(|rate| Arc::new(Schedule::new(start, rate)));
    let mut workers = Vec::new();
    for worker in 0..args.concurrency {
        let (submitter, meter, args) = (submitter.clone(), meter.clone(), args.clone());
        let schedule = schedule.clone();
        workers.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                if let Some(schedule) = &schedule {
                    let due = schedule.next_call();
                    if due >= deadline {
                        break;
                    }
                    tokio::time::sleep_until(due.into()).await;
                }
                let family = if rand::rng().random_bool(args.hot_share) {
                    0
                } else {
                    rand::rng().random_range(0..args.families)
                };
                let denied = rand::rng().random_bool(args.denied_share);
                ToolCall::new(worker, family, denied)
                    .run(&submitter, &meter)
                    .await;
                meter.calls.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let progress = {
        let (meter, quiet) = (meter.clone(), args.quiet);
        tokio::spawn(async move {
            while !quiet && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let done = meter.commands.load(Ordering::Relaxed);
                eprint!(
                    "\r{:>5.1} s  {done} commands  {:.0}/s   ",
                    start.elapsed().as_secs_f64(),
                    done as f64 / start.elapsed().as_secs_f64()
                );
            }
            if !quiet {
                eprintln!();
            }
        })
    };
    for worker in workers {
        let _ = worker.await;
    }
    let _ = progress.await;
    let seconds = start.elapsed().as_secs_f64();
    let Latencies {
        histogram,
        slowest_by_second,
    } = meter
        .latencies
        .lock()
        .map(|l| l.clone())
        .unwrap_or_else(|p| p.into_inner().clone());
    let commands = meter.commands.load(Ordering::Relaxed);
    let max_ms_by_second = (slowest_by_second.iter())
        .map(|&us| us as f64 / 1_000.0)
        .collect();
    BenchReport {
        max_ms_by_second,
        started_at_unix_ms,
        offered_commands_per_s: args.rate,
        calls: meter.calls.load(Ordering::Relaxed),
        commands,
        errors: meter.error_count(),
        errors_by_kind: meter.errors_by_kind(),
        seconds,
        commands_per_s: commands as f64 / seconds,
        p50_ms: histogram.value_at_quantile(0.50) as f64 / 1_000.0,
        p99_ms: histogram.value_at_quantile(0.99) as f64 / 1_000.0,
        max_ms: histogram.max() as f64 / 1_000.0,
        batch: args.batch,
        concurrency: args.concurrency,
    }
}

/// The fixed schedule of `--rate`: call `k` starts at `start + k × step`, whichever caller is
/// free takes it.
struct Schedule {
    start: Instant,
    step: Duration,
    next: AtomicU64,
}

impl Schedule {
    fn new(start: Instant, commands_per_s: f64) -> Self {
        assert!(
            commands_per_s > 0.0 && commands_per_s <= MAX_RATE_PER_S,
            "the rate was checked when parsed: {commands_per_s}"
        );
        Self {
            start,
            step: Duration::from_secs_f64(COMMANDS_PER_CALL / commands_per_s),
            next: AtomicU64::new(0),
        }
    }

    /// When the next unclaimed call is due.
    fn next_call(&self) -> Instant {
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        self.start
            + self
                .step
                .saturating_mul(u32::try_from(k).unwrap_or(u32::MAX))
    }
}

/// A tool call is authorize + capture + reconcile.
const COMMANDS_PER_CALL: f64 = 3.0;

/// Where a worker's commands go: one unary call each, or through the shared batcher.
struct Submitter {
    client: Arc<TallyClient>,
    batching: Option<BatchingClient>,
}

/// What the workers measure together.
struct Meter {
    /// One lock per command for both records of its latency.
    latencies: Mutex<Latencies>,
    calls: AtomicU64,
    /// Shared with the caller of [`drive_counted`].
    commands: Arc<AtomicU64>,
    /// Per kind of `ERROR_KINDS`: how many, and the first one's message.
    error_kinds: Mutex<[(u64, Option<String>); ERROR_KINDS.len()]>,
    /// When the load began: the origin of `Latencies::slowest_by_second`.
    start: Instant,
}

/// Every command's latency (µs), as a histogram and as the slowest per second.
#[derive(Clone)]
struct Latencies {
    histogram: Histogram<u64>,
    /// Per second since the start, the slowest command (µs) that ended in it. One slot per
    /// second the run lasted, so it is bounded by the run's duration.
    slowest_by_second: Vec<u64>,
}

impl Meter {
    fn new(start: Instant, commands: Arc<AtomicU64>) -> Self {
        Self {
            latencies: Mutex::new(Latencies {
                histogram: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
                slowest_by_second: Vec::new(),
            }),
            calls: AtomicU64::new(0),
            commands,
            error_kinds: Mutex::new(Default::default()),
            start,
        }
    }

    /// Counts a command that got no decision, by its kind.
    fn error(&self, outcome: &Outcome) {
        let (kind, message) = match outcome {
            Outcome::Decided(_) => unreachable!("a decision is not an error"),
            Outcome::Refused(error) => (0, error.to_string()),
            Outcome::Unavailable { reason } => (1, reason.clone()),
            Outcome::NotApplied { event_id } => (2, format!("event {event_id} not applied")),
            Outcome::Unknown { event_id, reason } => (3, format!("event {event_id}: {reason}")),
        };
        let mut kinds = self.error_kinds.lock().unwrap_or_else(|p| p.into_inner());
        let (count, first) = &mut kinds[kind];
        *count += 1;
        first.get_or_insert_with(|| {
            tally_api::text::bounded(&message, MAX_ERROR_MESSAGE_BYTES).to_owned()
        });
    }

    /// Commands that got no decision, of every kind.
    fn error_count(&self) -> u64 {
        let kinds = self.error_kinds.lock().unwrap_or_else(|p| p.into_inner());
        kinds.iter().map(|(count, _)| count).sum()
    }

    fn errors_by_kind(&self) -> Vec<ErrorKindCount> {
        let kinds = self.error_kinds.lock().unwrap_or_else(|p| p.into_inner());
        (ERROR_KINDS.iter().zip(kinds.iter()))
            .filter(|(_, (count, _))| *count > 0)
            .map(|(kind, (count, first))| ErrorKindCount {
                kind,
                count: *count,
                first: first.clone().unwrap_or_default(),
            })
            .collect()
    }

    /// Records one command's latency, ended now.
    fn record(&self, micros: u64) {
        let second = self.start.elapsed().as_secs() as usize;
        if let Ok(mut latencies) = self.latencies.lock() {
            let _ = latencies.histogram.record(micros.max(1));
            let by_second = &mut latencies.slowest_by_second;
            if by_second.len() <= second {
                by_second.resize(second + 1, 0);
            }
            by_second[second] = by_second[second].max(micros);
        }
    }
}

/// The second of the run in which the slowest command ended, if any command did.
fn slowest_second(max_ms_by_second: &[f64]) -> Option<usize> {
    max_ms_by_second
        .iter()
        .enumerate()
        .filter(|(_, &ms)| ms > 0.0)
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(second, _)| second)
}

impl Submitter {
    /// Submits one command, records its latency and counts it; the decision, if there is one.
    async fn submit(&self, meter: &Meter, command: ClientCommand) -> Option<Decision> {
        let began = Instant::now();
        let outcome = match &self.batching {
            Some(batching) => batching.submit(command).await,
            None => self.client.submit(command).await,
        };
        meter.record(began.elapsed().as_micros() as u64);
        match outcome {
            Outcome::Decided(decision) => {
                meter.commands.fetch_add(1, Ordering::Relaxed);
                Some(decision)
            }
            other => {
                meter.error(&other);
                None
            }
        }
    }
}

/// One monetary tool call, named as the kernel names it (docs/spec.md §9, `crate::ids`) with a
/// random UUID as the request id, as kernels' callers send: authorize, then a capture named
/// after the authorize's commit index, then reconcile. Ids built from a run id, worker and
/// counter would all share their first 23 bytes, which no real workload does.
struct ToolCall {
    worker: usize,
    family_id: FamilyId,
    hold: HoldId,
    not_after_ms: u64,
    /// Asks over the per-call limit: the authorize is denied and the call ends there.
    over_limit: bool,
}

const BENCH_CAPABILITY: &str = "bench-cap";

impl ToolCall {
    fn new(worker: usize, family: u64, over_limit: bool) -> Self {
        let request_id = request_uuid(rand::rng().random());
        Self {
            worker,
            family_id: format!("bench-family-{family}").into(),
            hold: ids::hold_id(&request_id, &BENCH_CAPABILITY.into(), 0)
                .expect("a UUID is a short request id"),
            not_after_ms: crate::wall_clock_ms() + 60_000,
            over_limit,
        }
    }

    /// Runs the call; a step that gets no decision ends it, as a kernel would not go on.
    async fn run(&self, submitter: &Submitter, meter: &Meter) {
        let Some(authorized) = submitter.submit(meter, self.authorize()).await else {
            return;
        };
        if authorized.outcome.is_denied() {
            return;
        }
        let Some(authorize_index) = authorized.commit_index else {
            return;
        };
        if submitter
            .submit(meter, self.capture(authorize_index))
            .await
            .is_some()
        {
            submitter.submit(meter, self.reconcile()).await;
        }
    }

    fn command(&self, event_id: EventId, op: Operation) -> ClientCommand {
        ClientCommand {
            header: CommandHeader {
                family_id: self.family_id.clone(),
                capability_id: BENCH_CAPABILITY.into(),
                grant_index: 0,
                event_id,
                not_after_ms: self.not_after_ms,
            },
            op,
        }
    }

    fn authorize(&self) -> ClientCommand {
        self.command(
            ids::authorize_event(&self.hold),
            Operation::AuthorizeHold {
                hold_id: self.hold.clone(),
                requested_exposure_units: if self.over_limit { 200 } else { 100 },
                limits: GrantLimits::monetary(None, Some(100), None, "USD"),
                ancestors: vec![],
                hold_timeout_ms: Some(60_000),
            },
        )
    }

    fn capture(&self, authorize_index: BudgetCommitIndex) -> ClientCommand {
        self.command(
            ids::capture_event(&self.hold, authorize_index),
            Operation::CaptureInvocation {
                hold_id: self.hold.clone(),
                attempt_id: format!("attempt-{}", self.worker).into(),
            },
        )
    }

    fn reconcile(&self) -> ClientCommand {
        self.command(
            ids::reconcile_event(&self.hold),
            Operation::ReconcileHold {
                hold_id: self.hold.clone(),
                exposed_cost_units: 100,
                realized_spend_units: 60,
            },
        )
    }
}

/// A version-4 UUID's text from 128 random bits.
fn request_uuid(bits: u128) -> String {
    let bits = (bits & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        bits >> 96,
        (bits >> 80) & 0xffff,
        (bits >> 64) & 0xffff,
        (bits >> 48) & 0xffff,
        bits & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_spaces_calls_by_the_rate_and_bad_rates_say_why() {
        let start = Instant::now();
        let schedule = Schedule::new(start, 3_000.0);
        let due: Vec<Duration> = (0..4).map(|_| schedule.next_call() - start).collect();
        assert_eq!(
            due,
            [0, 1, 2, 3].map(Duration::from_millis),
            "3,000 commands/s is a tool call every millisecond"
        );
        assert_eq!(parse_rate("5000"), Ok(5_000.0));
        for (text, says) in [
            ("0", "within"),
            ("-1", "within"),
            ("1e9", "within"),
            ("x", "`x`"),
        ] {
            let error = parse_rate(text).expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn the_slowest_command_is_kept_per_second_it_ended_in() {
        let meter = Meter::new(
            Instant::now() - Duration::from_millis(2_500),
            Arc::new(AtomicU64::new(0)),
        );
        meter.record(5_000);
        meter.record(3_000);
        let latencies = meter.latencies.lock().expect("lock").clone();
        assert_eq!(
            latencies.slowest_by_second,
            [0, 0, 5_000],
            "ended in the run's third second"
        );
        assert_eq!(latencies.histogram.len(), 2);
        assert_eq!(slowest_second(&[0.0, 3.0, 7.0, 1.0]), Some(2));
        assert_eq!(slowest_second(&[0.0, 0.0]), None, "no command ended");
    }

    #[test]
    fn errors_are_counted_by_kind_with_the_first_message_of_each() {
        let meter = Meter::new(Instant::now(), Arc::new(AtomicU64::new(0)));
        let unavailable = |reason: &str| Outcome::Unavailable {
            reason: reason.to_owned(),
        };
        meter.error(&unavailable("no leader"));
        meter.error(&unavailable("still no leader"));
        meter.error(&Outcome::Unknown {
            event_id: "e-1".into(),
            reason: "é".repeat(MAX_ERROR_MESSAGE_BYTES),
        });
        assert_eq!(meter.error_count(), 3);
        let kinds = meter.errors_by_kind();
        let summary: Vec<(&str, u64)> = kinds.iter().map(|k| (k.kind, k.count)).collect();
        assert_eq!(
            summary,
            [("unavailable", 2), ("unknown", 1)],
            "no empty kinds"
        );
        assert_eq!(kinds[0].first, "no leader", "the first message is kept");
        assert!(kinds[1].first.starts_with("event e-1: é"));
        assert!(
            kinds[1].first.len() <= MAX_ERROR_MESSAGE_BYTES,
            "a long message is cut, on a character's boundary"
        );
    }

    #[test]
    fn request_ids_are_version_4_uuids() {
        assert_eq!(request_uuid(0), "00000000-0000-4000-8000-000000000000");
        assert_eq!(
            request_uuid(u128::MAX),
            "ffffffff-ffff-4fff-bfff-ffffffffffff"
        );
        let call = ToolCall::new(3, 7, false);
        let authorize = call.authorize();
        assert_eq!(authorize.header.family_id.as_str(), "bench-family-7");
        let event = authorize.header.event_id.as_str();
        assert!(event.starts_with("budget-hold:") && event.ends_with(":bench-cap:0:authorize"));
        assert_eq!(
            event.len(),
            "budget-hold:".len() + 36 + ":bench-cap:0:authorize".len()
        );
        let index = BudgetCommitIndex::new(9, 2, 0);
        assert_eq!(
            call.capture(index).header.event_id,
            ids::capture_event(&call.hold, index),
            "the kernel's capture name (docs/spec.md §9)"
        );
        assert_eq!(
            call.reconcile().header.event_id,
            ids::reconcile_event(&call.hold)
        );
    }

    /// A call of `--denied-share` is denied by the ledger's own rules (not refused as
    /// invalid), and a whole call's authorize is allowed.
    #[test]
    fn an_over_limit_call_is_denied_and_a_whole_one_authorized() {
        use tally_ledger::{ApplyCtx, ClusterParams, Command, Family, LogPosition};
        for (over_limit, denied) in [(true, true), (false, false)] {
            let call = ToolCall::new(0, 1, over_limit);
            let mut family = Family::new(call.family_id.clone());
            let ctx = ApplyCtx {
                log_id: LogPosition { term: 1, index: 1 },
                command_position: 0,
                now_ms: call.not_after_ms - 60_000,
                params: ClusterParams::default(),
                no_space: false,
            };
            let decision = family
                .apply(&Command::Apply(call.authorize()), &ctx)
                .expect("a valid authorize");
            assert_eq!(decision.outcome.is_denied(), denied, "{decision:?}");
        }
    }
}
