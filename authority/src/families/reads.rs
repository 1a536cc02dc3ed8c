//! The reads of docs/spec.md §7 through the router. A read never holds the router's lock (the
//! one `apply` takes) while it waits for an actor or decodes a family.
//!
//! Each read has two halves. The first is the `&self` method below: synchronous, it runs under
//! the lock and only does cheap things: it queues a `FamilyMsg::Read` in the mailbox of each
//! live family the read needs, and takes a view of the family store for the passivated ones.
//! It returns the second half, a future that borrows nothing from the router (`'static`), so
//! the lock is dropped before it is awaited: it awaits the actors' answers and reads and
//! decodes the passivated families from the view (on a blocking thread), while `apply` goes on. Reads
//! never change which families are live. [`read`] is how the service runs one.
//!
//! **Why the answer is still linearizable.** For a `LINEARIZABLE` read the service's
//! `read_barrier` first waits until this node has applied the read index, so the state it
//! reads holds every write acknowledged before the read began (`applied` is published only
//! after `FamilyRouter::apply` returned). Under the lock no round is in flight: `apply` holds
//! it for a whole round and awaits every family's answer. So each live actor's state is the
//! state at `last_applied`, and no apply waits in its mailbox. Only the router sends to actors
//! and mailboxes are FIFO, so the read queued now is answered before any apply of a later
//! round, from exactly that state, however late the actor gets to it. The store's view is a
//! redb read transaction at the last commit, and passivation commits before it returns, so
//! the view holds every passivated family as of the lock; later commits do not change it. Every family therefore answers from the state at one index, `last_applied`
//! when the lock was taken: at or after the read index and before the answer. The read takes
//! effect at that moment, and nothing applied later is mixed in.
//!
//! **Families that move meanwhile.** Passivating an actor queues its own read behind ours and
//! stops the actor only once that one answered, and a family is forgotten only right after
//! its own apply answered, so neither drops a read queued before. What does is the router going
//! away (a snapshot install replaces it; a shutdown stops every actor), or the family failing:
//! the read then fails with `RouterError::ReadInterrupted`, and [`read`] starts it once more
//! under the lock, on whatever router is there then. A second interruption is an error, never
//! a partial answer.

use std::cmp::Ordering;
use std::future::Future;
use std::sync::Arc;

use ractor::ActorRef;
use tally_ledger::cold::{event_read_with_stored, hold_read_with_stored, ColdRowError};
use tally_ledger::limits::MAX_LIST_LIMIT;
use tally_ledger::list_position::{hold_order, usage_order};
use tally_ledger::snapshot::digest_bytes;
use tally_ledger::{
    AccountKey, BudgetCommitIndex, CapabilityId, ColdKey, EventId, EventLookup, EventRecord,
    Family, FamilyId, Hold, HoldFilter, HoldId, HoldView, UsagePosition, UsageRecord,
};
use tokio::sync::{oneshot, Mutex};

use super::actor_table::{gone, send, ActorTable, Located};
use super::cold_keys::cold_row_key;
use super::error::RouterError;
use super::family_store::{FamilyStore, StoreView};
use super::messages::FamilyMsg;
use super::router::FamilyRouter;

/// Runs a read against the shared router: `start` runs under the lock and returns the rest of
/// the read, awaited with the lock released (see the module docs). A read interrupted by an
/// actor stopping (the router was replaced) is started once more.
///
/// ```text
/// let usage = families::read(&router, |r| r.get_usage(&family_id, &key)).await?;
/// ```
pub async fn read<T, Fut>(
    router: &Mutex<FamilyRouter>,
    start: impl Fn(&FamilyRouter) -> Fut,
) -> Result<T, RouterError>
where
    Fut: Future<Output = Result<T, RouterError>>,
{
    // `Fut` cannot borrow the router, and the guard is a temporary of the `let`: the lock is
    // released before the read is awaited.
    let first = start(&*router.lock().await);
    match first.await {
        Err(RouterError::ReadInterrupted { family_id }) => {
            tracing::debug!(%family_id, "a read was interrupted; starting it again");
        }
        done => return done,
    }
    let again = start(&*router.lock().await);
    again.await
}

impl FamilyRouter {
    pub fn get_usage(
        &self,
        family_id: &FamilyId,
        key: &AccountKey,
    ) -> impl Future<Output = Result<Option<UsageRecord>, RouterError>> + Send + 'static {
        let key = key.clone();
        let part = self.start_family(family_id, move |f: &Family| f.get_usage(&key));
        async move { Ok(part?.answer().await?.flatten()) }
    }

    /// Across every family `within` accepts when `family_id` is `None` (a namespace-bound
    /// caller sees its own), merged in docs/spec.md order (`updated_at_ms desc,
    /// capability_id, grant_index`, then family id), after `after`.
    pub fn list_usages(
        &self,
        family_id: Option<&FamilyId>,
        within: &dyn Fn(&FamilyId) -> bool,
        capability_id: Option<&CapabilityId>,
        after: Option<&UsagePosition>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(FamilyId, UsageRecord)>, RouterError>> + Send + 'static
    {
        let limit = limit.min(MAX_LIST_LIMIT);
        let capability_id = capability_id.cloned();
        let after = after.cloned();
        let mut scan = Scan::new(move |f: &Family| {
            f.list_usages(capability_id.as_ref(), after.as_ref(), limit)
        });
        let started = self.check_running().and_then(|()| match family_id {
            Some(family_id) => scan.add(family_id, self.actors.locate(family_id), &self.actors),
            None => scan.add_all(&self.actors, within),
        });
        async move {
            started?;
            scan.rows(limit, usage_rows).await
        }
    }

    /// Retained events of one family in commit order.
    pub fn list_events(
        &self,
        family_id: &FamilyId,
        capability_id: Option<&CapabilityId>,
        grant_index: Option<u32>,
        after: Option<BudgetCommitIndex>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<EventRecord>, RouterError>> + Send + 'static {
        let capability_id = capability_id.cloned();
        let read =
            move |f: &Family| f.list_events(capability_id.as_ref(), grant_index, after, limit);
        let part = self.start_family(family_id, read);
        async move { Ok(part?.answer().await?.unwrap_or_default()) }
    }

    /// `Unknown` for a family that holds no state: an in-flight command may still create it.
    pub fn get_event(
        &self,
        family_id: &FamilyId,
        event_id: &EventId,
    ) -> impl Future<Output = Result<EventLookup, RouterError>> + Send + 'static {
        let (id, named) = (event_id.clone(), event_id.clone());
        let part = self.start_family(family_id, move |f: &Family| f.get_event(&id));
        let stored = self.stored_row(family_id, ColdKey::Event(event_id.clone()));
        async move {
            let found = part?.answer().await?.unwrap_or(EventLookup::Unknown);
            if found != EventLookup::Unknown {
                return Ok(found);
            }
            let row = stored.read().await?;
            stored.finish(|row| event_read_with_stored(found, &named, row), row)
        }
    }

    pub fn get_hold(
        &self,
        family_id: &FamilyId,
        hold_id: &HoldId,
    ) -> impl Future<Output = Result<Option<HoldView>, RouterError>> + Send + 'static {
        let (id, named) = (hold_id.clone(), hold_id.clone());
        let part = self.start_family(family_id, move |f: &Family| f.get_hold(&id));
        let stored = self.stored_row(family_id, ColdKey::Hold(hold_id.clone()));
        async move {
            let found = part?.answer().await?.flatten();
            if found.is_some() {
                return Ok(found);
            }
            let row = stored.read().await?;
            stored.finish(|row| hold_read_with_stored(found, &named, row), row)
        }
    }

    /// The second place a point read looks: the family's row out of memory under `key`, read
    /// from a view taken after the family answered. Rows only ever join the store, and a
    /// family keeps the rows its last batch moved until the router stored them (its next
    /// batch), so a row the family no longer holds is in that view.
    fn stored_row(&self, family_id: &FamilyId, key: ColdKey) -> StoredRow {
        StoredRow {
            family_id: family_id.clone(),
            store: (self.cold.rows(family_id) > 0).then(|| self.actors.store().clone()),
            key,
        }
    }

    /// Live holds for reconcilers, oldest first (`created_at_ms`, family id, hold id), after
    /// `filter.after`. Across the families `within` accepts when `family_id` is `None`: only
    /// the families the hold index names (those with live holds, and restored ones not counted yet), since no
    /// other family has a row to add (`hold_index.rs`).
    pub fn list_holds(
        &self,
        family_id: Option<&FamilyId>,
        within: &dyn Fn(&FamilyId) -> bool,
        filter: &HoldFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(FamilyId, Hold)>, RouterError>> + Send + 'static {
        let limit = limit.min(MAX_LIST_LIMIT);
        let filter = filter.clone();
        let mut scan = Scan::new(move |f: &Family| f.list_holds(&filter, limit));
        let started = self.check_running().and_then(|()| match family_id {
            Some(family_id) => scan.add(family_id, self.actors.locate(family_id), &self.actors),
            None => (self.holds.candidates())
                .filter(|family_id| within(family_id))
                .try_for_each(|family_id| {
                    scan.add(family_id, self.actors.locate(family_id), &self.actors)
                }),
        });
        async move {
            started?;
            scan.rows(limit, hold_rows).await
        }
    }

    /// One family's state digest (`None`: the family holds no state).
    pub fn family_digest(
        &self,
        family_id: &FamilyId,
    ) -> impl Future<Output = Result<Option<[u8; 32]>, RouterError>> + Send + 'static {
        let part = self.start_family(family_id, Family::digest);
        async move {
            match part? {
                // A family's digest is its canonical bytes' digest: no decode needed.
                FamilyPart::Stored(family_id, view, _) => {
                    let named = family_id.clone();
                    off_the_runtime(named, move || view.get(&family_id))
                        .await
                        .map(|bytes| Some(digest_bytes(&bytes)))
                }
                part => part.answer().await,
            }
        }
    }

    /// The first half of a one-family read (see the module docs).
    fn start_family<R, F>(
        &self,
        family_id: &FamilyId,
        read: F,
    ) -> Result<FamilyPart<R, F>, RouterError>
    where
        R: Send + 'static,
        F: FnOnce(&Family) -> R + Send + 'static,
    {
        self.check_running()?;
        Ok(match self.actors.locate(family_id) {
            Located::Live(actor) => {
                FamilyPart::Live(family_id.clone(), ask(family_id, actor, read)?)
            }
            Located::Stored(_) => FamilyPart::Stored(family_id.clone(), self.actors.view()?, read),
            Located::Absent => FamilyPart::Absent,
        })
    }

    /// Runs `read` against every live family at once; answers in family-id order. Holds the
    /// caller's borrow (and so the lock) until every actor answered: for snapshots and
    /// digests, which need the state at one index with apply held off, not for client reads.
    pub(super) async fn read_live<R: Send + 'static>(
        &self,
        read: impl Fn(&Family) -> R + Send + Sync + 'static,
    ) -> Result<std::collections::BTreeMap<FamilyId, R>, RouterError> {
        let read = Arc::new(read);
        self.ask_live(move |tx| {
            let read = Arc::clone(&read);
            FamilyMsg::Read(Box::new(move |family: &Family| {
                let _ = tx.send(read(family));
            }))
        })
        .await
    }

    /// Every live family itself, shared (copy on write: see `FamilyMsg::Share`).
    pub(super) async fn share_live(
        &self,
    ) -> Result<std::collections::BTreeMap<FamilyId, Arc<Family>>, RouterError> {
        self.ask_live(FamilyMsg::Share).await
    }

    /// Sends every live actor the message `ask` makes around a reply channel and collects
    /// the answers by family. A family that does not answer (its actor is gone) fails it all.
    async fn ask_live<R: Send + 'static>(
        &self,
        ask: impl Fn(oneshot::Sender<R>) -> FamilyMsg,
    ) -> Result<std::collections::BTreeMap<FamilyId, R>, RouterError> {
        self.check_running()?;
        let mut pending = Vec::with_capacity(self.actors.live_count());
        for (family_id, actor) in self.actors.live() {
            let (tx, rx) = oneshot::channel();
            send(family_id, actor, ask(tx))?;
            pending.push((family_id.clone(), rx));
        }
        let mut answers = std::collections::BTreeMap::new();
        for (family_id, rx) in pending {
            let answer = rx.await.map_err(|_| gone(&family_id))?;
            answers.insert(family_id, answer);
        }
        Ok(answers)
    }
}

/// Queues `read` in a live family's mailbox; the receiver gets its answer.
fn ask<R: Send + 'static>(
    family_id: &FamilyId,
    actor: &ActorRef<FamilyMsg>,
    read: impl FnOnce(&Family) -> R + Send + 'static,
) -> Result<oneshot::Receiver<R>, RouterError> {
    let (tx, rx) = oneshot::channel();
    let message = FamilyMsg::Read(Box::new(move |family: &Family| {
        // The reader may have given up; then nobody needs the answer.
        let _ = tx.send(read(family));
    }));
    send(family_id, actor, message)?;
    Ok(rx)
}

/// A point read's look among a family's rows out of memory (see `FamilyRouter::stored_row`).
struct StoredRow {
    family_id: FamilyId,
    /// `None`: the family had no row out of memory when the read started.
    store: Option<FamilyStore>,
    key: ColdKey,
}

impl StoredRow {
    /// The row's bytes, if stored (on a blocking thread).
    async fn read(&self) -> Result<Option<Vec<u8>>, RouterError> {
        let Some(store) = self.store.clone() else {
            return Ok(None);
        };
        let key = cold_row_key(&self.family_id, &self.key.to_bytes());
        off_the_runtime(self.family_id.clone(), move || store.view()?.cold_row(&key)).await
    }

    /// The read's answer from the stored row; a row that does not decode is this node's fault.
    fn finish<T>(
        &self,
        answer: impl FnOnce(Option<&[u8]>) -> Result<T, ColdRowError>,
        row: Option<Vec<u8>>,
    ) -> Result<T, RouterError> {
        answer(row.as_deref()).map_err(|error| RouterError::FamilyFailed {
            family_id: self.family_id.clone(),
            reason: error.to_string(),
        })
    }
}

/// One family's part of a read, taken under the lock.
enum FamilyPart<R, F> {
    /// The read is queued in the live actor's mailbox: its answer, to come.
    Live(FamilyId, oneshot::Receiver<R>),
    /// A view of the family store at the cut, and the read to run once the family is read
    /// from it and decoded.
    Stored(FamilyId, StoreView, F),
    /// The family holds no state.
    Absent,
}

impl<R, F> FamilyPart<R, F>
where
    R: Send + 'static,
    F: FnOnce(&Family) -> R + Send + 'static,
{
    /// The second half, without the lock. `None`: the family holds no state.
    async fn answer(self) -> Result<Option<R>, RouterError> {
        match self {
            Self::Live(family_id, answer) => {
                answer.await.map(Some).map_err(|_| interrupted(&family_id))
            }
            Self::Stored(family_id, view, read) => {
                // A disk read: always on a blocking thread.
                let named = family_id.clone();
                let run = move || {
                    let bytes = view.get(&family_id)?;
                    decode(&family_id, &bytes).map(|family| read(&family))
                };
                off_the_runtime(named, run).await.map(Some)
            }
            Self::Absent => Ok(None),
        }
    }
}

type Order<T> = fn(&(FamilyId, T), &(FamilyId, T)) -> Ordering;

fn usage_rows(a: &(FamilyId, UsageRecord), b: &(FamilyId, UsageRecord)) -> Ordering {
    usage_order((&a.0, &a.1), (&b.0, &b.1))
}

fn hold_rows(a: &(FamilyId, Hold), b: &(FamilyId, Hold)) -> Ordering {
    hold_order((&a.0, &a.1), (&b.0, &b.1))
}

/// `within` for a read over every family: a caller not bound to namespaces.
pub fn every_family(_: &FamilyId) -> bool {
    true
}

/// A list read over some families, taken under the lock: the reads queued in live actors
/// (their answers to come), the passivated families, and a view of the store to read them.
struct Scan<T, F> {
    read: Arc<F>,
    live: Vec<(FamilyId, oneshot::Receiver<Vec<T>>)>,
    stored: Vec<FamilyId>,
    view: Option<StoreView>,
}

impl<T, F> Scan<T, F>
where
    T: Send + 'static,
    F: Fn(&Family) -> Vec<T> + Send + Sync + 'static,
{
    fn new(read: F) -> Self {
        Self {
            read: Arc::new(read),
            live: Vec::new(),
            stored: Vec::new(),
            view: None,
        }
    }

    /// Adds one family, wherever it is (an absent family has no rows).
    fn add(
        &mut self,
        family_id: &FamilyId,
        located: Located<'_>,
        actors: &ActorTable,
    ) -> Result<(), RouterError> {
        match located {
            Located::Live(actor) => {
                let read = Arc::clone(&self.read);
                let answer = ask(family_id, actor, move |family| read(family))?;
                self.live.push((family_id.clone(), answer));
            }
            Located::Stored(_) => {
                if self.view.is_none() {
                    self.view = Some(actors.view()?);
                }
                self.stored.push(family_id.clone());
            }
            Located::Absent => {}
        }
        Ok(())
    }

    /// Adds every family `within` accepts.
    fn add_all(
        &mut self,
        actors: &ActorTable,
        within: &dyn Fn(&FamilyId) -> bool,
    ) -> Result<(), RouterError> {
        for (family_id, actor) in actors.live().filter(|(f, _)| within(f)) {
            self.add(family_id, Located::Live(actor), actors)?;
        }
        for (family_id, row) in actors.stored().iter().filter(|(f, _)| within(f)) {
            self.add(family_id, Located::Stored(*row), actors)?;
        }
        Ok(())
    }

    /// The second half, without the lock: every family's rows merged in `order`, at most
    /// `limit`. Passivated families decode while the actors answer.
    async fn rows(self, limit: usize, order: Order<T>) -> Result<Vec<(FamilyId, T)>, RouterError> {
        let Self {
            read,
            live,
            stored,
            view,
        } = self;
        let mut merged = Merge::new(limit, order);
        let first = stored.first().cloned();
        let decode_all = move || -> Result<Vec<(FamilyId, T)>, RouterError> {
            let mut merged = Merge::new(limit, order);
            let Some(view) = view else {
                return Ok(Vec::new());
            };
            for family_id in stored {
                let bytes = view.get(&family_id)?;
                let rows = read(&decode(&family_id, &bytes)?);
                merged.add(family_id, rows);
            }
            Ok(merged.finish())
        };
        // A blocking task (disk reads) starts at once: it overlaps the actors' answers.
        let decoding = first.map(|first| (first, tokio::task::spawn_blocking(decode_all)));
        for (family_id, answer) in live {
            let rows = answer.await.map_err(|_| interrupted(&family_id))?;
            merged.add(family_id, rows);
        }
        if let Some((first, decoding)) = decoding {
            merged.extend(joined(first, decoding).await?);
        }
        Ok(merged.finish())
    }
}

/// Rows from many families merged into one list in `order`, keeping at most about `2 * limit`
/// rows beyond one family's share.
struct Merge<T> {
    rows: Vec<(FamilyId, T)>,
    limit: usize,
    order: Order<T>,
}

impl<T> Merge<T> {
    fn new(limit: usize, order: Order<T>) -> Self {
        Self {
            rows: Vec::new(),
            limit,
            order,
        }
    }

    fn add(&mut self, family_id: FamilyId, rows: Vec<T>) {
        (self.rows).extend(rows.into_iter().map(|row| (family_id.clone(), row)));
        self.trim();
    }

    fn extend(&mut self, rows: Vec<(FamilyId, T)>) {
        self.rows.extend(rows);
        self.trim();
    }

    fn trim(&mut self) {
        if self.rows.len() > self.limit.saturating_mul(2) {
            self.rows.sort_by(self.order);
            self.rows.truncate(self.limit);
        }
    }

    fn finish(mut self) -> Vec<(FamilyId, T)> {
        self.rows.sort_by(self.order);
        self.rows.truncate(self.limit);
        self.rows
    }
}

/// Runs CPU-heavy read work (decoding) on a blocking thread. A panic there is the read's own
/// panic; work cancelled because the runtime is shutting down interrupts the read.
pub(super) async fn off_the_runtime<T: Send + 'static>(
    family_id: FamilyId,
    work: impl FnOnce() -> Result<T, RouterError> + Send + 'static,
) -> Result<T, RouterError> {
    joined(family_id, tokio::task::spawn_blocking(work)).await
}

/// The result of blocking read work (see `off_the_runtime`).
async fn joined<T>(
    family_id: FamilyId,
    work: tokio::task::JoinHandle<Result<T, RouterError>>,
) -> Result<T, RouterError> {
    match work.await {
        Ok(done) => done,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => Err(interrupted(&family_id)),
    }
}

/// Decodes a passivated family for a read; undecodable state is a fatal fault.
pub(super) fn decode(family_id: &FamilyId, bytes: &[u8]) -> Result<Family, RouterError> {
    Family::from_snapshot_bytes(bytes).map_err(|error| RouterError::FamilyFailed {
        family_id: family_id.clone(),
        reason: error.to_string(),
    })
}

fn interrupted(family_id: &FamilyId) -> RouterError {
    RouterError::ReadInterrupted {
        family_id: family_id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::time::Duration;

    use tally_ledger::{
        ClientCommand, Command, CommandHeader, GrantLimits, LogPosition, Operation,
    };

    use super::*;
    use crate::families::{EntryInput, EntryPayload, RouterConfig};

    const T0: u64 = 1_700_000_000_000;
    const WATCHDOG: Duration = Duration::from_secs(10);

    fn authorize(family_id: &FamilyId, hold: &str, now_ms: u64) -> Command {
        Command::Apply(ClientCommand {
            header: CommandHeader {
                family_id: family_id.clone(),
                capability_id: "cap".into(),
                grant_index: 0,
                event_id: format!("{hold}:authorize").into(),
                not_after_ms: now_ms + 60_000,
            },
            op: Operation::AuthorizeHold {
                hold_id: hold.into(),
                requested_exposure_units: 10,
                limits: GrantLimits::monetary(None, Some(100), None, "USD"),
                ancestors: vec![],
                hold_timeout_ms: None,
            },
        })
    }

    fn entry(index: u64, commands: Vec<Command>) -> EntryInput {
        EntryInput {
            log_id: LogPosition { term: 1, index },
            stamped_ms: T0 + index,
            payload: EntryPayload::Commands(commands),
        }
    }

    fn key() -> AccountKey {
        AccountKey::new("cap", 0)
    }

    /// Keeps a live family's actor busy until the returned sender is dropped or sends.
    fn hold_up(router: &FamilyRouter, family_id: &FamilyId) -> std::sync::mpsc::Sender<()> {
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let Located::Live(actor) = router.actors.locate(family_id) else {
            panic!("{family_id} is not live");
        };
        let busy = FamilyMsg::Read(Box::new(move |_: &Family| {
            // Hands this worker's other tasks to another thread while it waits.
            tokio::task::block_in_place(|| {
                let _ = release_rx.recv();
            });
        }));
        send(family_id, actor, busy).expect("the actor is running");
        release_tx
    }

    async fn usage_of(router: &Mutex<FamilyRouter>, family_id: &FamilyId) -> UsageRecord {
        read(router, |r| r.get_usage(family_id, &key()))
            .await
            .expect("read")
            .expect("the family has the account")
    }

    /// A read queued behind a slow message in a live family's mailbox waits there without
    /// the router lock: an apply to another family completes meanwhile, and the read then
    /// answers the family's state at its cut.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_waiting_on_a_busy_actor_does_not_hold_up_apply() {
        let (slow, other) = (FamilyId::from("slow"), FamilyId::from("other"));
        let mut router = FamilyRouter::new(RouterConfig::default()).expect("router");
        let first = vec![authorize(&slow, "h1", T0), authorize(&other, "h1", T0)];
        router.apply(vec![entry(1, first)]).await.expect("apply");
        let router = Mutex::new(router);
        let at_cut = usage_of(&router, &slow).await;
        let release = hold_up(&*router.lock().await, &slow);

        let mut reading = pin!(read(&router, |r| r.get_usage(&slow, &key())));
        // One poll queues the read behind the busy message and lets the lock go.
        tokio::select! {
            biased;
            _ = &mut reading => panic!("the busy actor answered"),
            () = std::future::ready(()) => {}
        }
        let mut applying = pin!(async {
            let more = vec![authorize(&other, "h2", T0)];
            router.lock().await.apply(vec![entry(2, more)]).await
        });
        let first = tokio::select! {
            applied = &mut applying => {
                applied.expect("apply");
                "apply"
            }
            _ = &mut reading => "read",
            () = tokio::time::sleep(WATCHDOG) => "neither (apply waits for the read's lock)",
        };
        release.send(()).expect("the actor waits");
        assert_eq!(first, "apply", "apply must not wait for a read in flight");
        let answer = reading.await.expect("read").expect("usage");
        assert_eq!(answer, at_cut);
        assert_eq!(usage_of(&router, &slow).await, at_cut, "only `other` moved");
    }

    /// A read whose actor stops before answering (a snapshot install replaced the router) is
    /// started once more, on the router there now, and answers from it: never an error or a
    /// partial answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_interrupted_by_a_router_replacement_is_started_again() {
        let f = FamilyId::from("f");
        let config = RouterConfig::default();
        let mut old = FamilyRouter::new(config).expect("router");
        let mut newer = FamilyRouter::new(config).expect("router");
        let first = entry(1, vec![authorize(&f, "h1", T0)]);
        let second = entry(2, vec![authorize(&f, "h2", T0)]);
        old.apply(vec![first.clone()]).await.expect("apply");
        newer.apply(vec![first, second]).await.expect("apply");
        let installed = newer.snapshot().await.expect("snapshot");
        let router = Mutex::new(old);
        let release = hold_up(&*router.lock().await, &f);

        let mut reading = pin!(read(&router, |r| r.get_usage(&f, &key())));
        tokio::select! {
            biased;
            _ = &mut reading => panic!("the busy actor answered"),
            () = std::future::ready(()) => {}
        }
        // What `install_snapshot` does: replace the router, shut the old one down.
        let restored = FamilyRouter::restore(config, installed).expect("restore");
        let Ok(mut swapping) = tokio::time::timeout(WATCHDOG, router.lock()).await else {
            let _ = release.send(());
            panic!("the read holds the router lock");
        };
        let old = std::mem::replace(&mut *swapping, restored);
        drop(swapping);
        let mut stopping = pin!(old.shutdown());
        // One poll stops every actor of the old router (and then waits for them).
        tokio::select! {
            biased;
            () = &mut stopping => panic!("the busy actor stopped"),
            () = std::future::ready(()) => {}
        }
        release.send(()).expect("the actor waits");
        stopping.await;
        let answer = tokio::time::timeout(WATCHDOG, reading)
            .await
            .expect("the read ends")
            .expect("started again, not an error")
            .expect("usage");
        assert_eq!(
            answer.account.invocation_count, 2,
            "the newer router answered"
        );
    }
}
