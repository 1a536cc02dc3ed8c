//! Pipelined log replication: openraft's replication stream for one follower, sent over one
//! `Append` gRPC stream that stays open, so the leader sends the next AppendEntries without
//! waiting for the reply to the last one.
//!
//! openraft's default (`stream_append_sequential`) sends one request and waits for its reply
//! before it sends the next, so an entry proposed while a request is in flight waits for that
//! round trip first: measured with replicas 30 ms apart (`tally-bench regions`), the leader's
//! commit latency was ~42 ms instead of ~31. Here requests go out as openraft produces them
//! and replies are matched to them in order (the follower's `Append` handler answers one reply
//! per request, in order), so a wait is one round trip, never one and a half.
//!
//! Each reply is due within the RPC's time-to-live after its request was sent or after the
//! previous reply came, whichever is later: the same bound per request as the sequential
//! way, as the follower answers them in order (it takes them in without waiting for each
//! one's fsync, so a reply never waits for more than the write its request joined). Injected faults (a cut link) are
//! checked before each request and each reply, as a long-lived stream would otherwise carry
//! messages across a link a test has cut.
//!
//! When openraft drops the replies (the session ended: a conflict, an error, a new leader's
//! payload), the request side stops at once, even while it waits for openraft's next request:
//! the request stream shares openraft's replication state, and one left running would take
//! requests meant for the next session and send them down a dead stream.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use openraft::entry::RaftEntry;
use openraft::errors::RPCError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendResult};
use tally_api::pb::raft_client::RaftClient;
use tally_api::pb::RaftBytes;
use tally_api::{decode_raft, encode_raft};
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::types::{LogId, NodeId, TypeConfig};
use crate::faults::NetworkFaults;

/// Requests sent and not yet answered, at most: openraft's replication keeps fewer in flight
/// (it waits on its own inflight queue); one more is a broken follower, and the stream ends.
pub const MAX_IN_FLIGHT_APPENDS: usize = 4_096;

type Item = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// One request on its way: the log range it carries and when it left.
struct Sent {
    prev: Option<LogId>,
    last: Option<LogId>,
    at: Instant,
}

/// What the request side tells the reply side.
#[derive(Default)]
struct Shared {
    in_flight: Mutex<VecDeque<Sent>>,
    /// Woken when a request leaves or the request side stops.
    changed: Notify,
    /// Why the request side stopped early (a cut link, an encoding failure).
    stopped: Mutex<Option<RPCError<TypeConfig>>>,
    /// Set (and `closing` woken) when the reply side is gone: the request side stops.
    closed: AtomicBool,
    closing: Notify,
}

impl Shared {
    fn in_flight(&self) -> std::sync::MutexGuard<'_, VecDeque<Sent>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn stop(&self, error: RPCError<TypeConfig>) {
        *self.stopped.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
        self.changed.notify_one();
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.closing.notify_waiters();
    }

    /// Waits until the reply side is gone.
    async fn closed(&self) {
        let closing = self.closing.notified();
        tokio::pin!(closing);
        closing.as_mut().enable();
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        closing.await;
    }

    fn take_stopped(&self) -> Option<RPCError<TypeConfig>> {
        self.stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("link {from} -> {to} is cut by fault injection")]
pub struct LinkCut {
    pub from: NodeId,
    pub to: NodeId,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct StreamFault(String);

fn network(error: impl std::error::Error + 'static) -> RPCError<TypeConfig> {
    super::network::network(&error)
}

/// The link and its faults, for both sides of the stream.
#[derive(Clone)]
pub struct Link {
    pub from: NodeId,
    pub to: NodeId,
    pub faults: Arc<NetworkFaults>,
    /// Set when the stream failed, so the connection reconnects before its next call.
    pub broken: Arc<AtomicBool>,
}

impl Link {
    /// The error of a call over this link while a test has it cut.
    pub fn cut(&self) -> Option<RPCError<TypeConfig>> {
        self.faults.is_cut(self.from, self.to).then(|| {
            super::network::unreachable(&LinkCut {
                from: self.from,
                to: self.to,
            })
        })
    }
}

/// Opens the `Append` stream to the follower and returns its replies as openraft's stream
/// results, one per request, in order.
pub async fn open<S>(
    mut client: RaftClient<Channel>,
    link: Link,
    input: S,
    ttl: Duration,
) -> Result<impl Stream<Item = Item> + Send + 'static, RPCError<TypeConfig>>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    let shared = Arc::new(Shared::default());
    let requests = requests(input, link.clone(), shared.clone());
    let replies = match tokio::time::timeout(ttl, client.append(requests)).await {
        Ok(Ok(replies)) => replies.into_inner(),
        Ok(Err(status)) => {
            link.broken.store(true, Ordering::Relaxed);
            return Err(network(status));
        }
        Err(elapsed) => {
            link.broken.store(true, Ordering::Relaxed);
            return Err(network(elapsed));
        }
    };
    Ok(answers(replies, link, shared, ttl))
}

/// The request side: each request encoded and recorded as in flight as it leaves; it stops
/// at a cut link or when too many are unanswered.
fn requests<S>(
    input: S,
    link: Link,
    shared: Arc<Shared>,
) -> impl Stream<Item = RaftBytes> + Send + 'static
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    futures_util::stream::unfold(input, move |mut input| {
        let (link, shared) = (link.clone(), shared.clone());
        async move {
            let request = tokio::select! {
                request = input.next() => request?,
                () = shared.closed() => return None,
            };
            if let Some(cut) = link.cut() {
                shared.stop(cut);
                return None;
            }
            if shared.in_flight().len() >= MAX_IN_FLIGHT_APPENDS {
                shared.stop(network(StreamFault(format!(
                    "{MAX_IN_FLIGHT_APPENDS} appends unanswered by node {}",
                    link.to
                ))));
                return None;
            }
            let payload = match encode_raft(&request) {
                Ok(payload) => payload,
                Err(error) => {
                    shared.stop(network(error));
                    return None;
                }
            };
            let prev = request.prev_log_id;
            let last = request.entries.last().map(|e| e.log_id()).or(prev);
            shared.in_flight().push_back(Sent {
                prev,
                last,
                at: Instant::now(),
            });
            shared.changed.notify_one();
            Some((
                RaftBytes {
                    payload: payload.into(),
                },
                input,
            ))
        }
    })
}

/// Where the reply side stands between two replies.
struct Answering {
    replies: tonic::Streaming<RaftBytes>,
    link: Link,
    shared: Arc<Shared>,
    ttl: Duration,
    /// When the last reply came (or the stream opened).
    progress_at: Instant,
}

/// The reply side: each reply matched to the oldest request in flight.
fn answers(
    replies: tonic::Streaming<RaftBytes>,
    link: Link,
    shared: Arc<Shared>,
    ttl: Duration,
) -> impl Stream<Item = Item> + Send + 'static {
    let answering = Answering {
        replies,
        link,
        shared,
        ttl,
        progress_at: Instant::now(),
    };
    futures_util::stream::unfold(Some(answering), |state| async move {
        let mut state = state?;
        let (item, go_on) = state.next().await?;
        if item.is_err() {
            state.link.broken.store(true, Ordering::Relaxed);
        }
        Some((item, go_on.then_some(state)))
    })
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl Answering {
    /// The next item and whether the stream goes on after it; `None` when it ended cleanly.
    async fn next(&mut self) -> Option<(Item, bool)> {
        loop {
            if let Some(stopped) = self.shared.take_stopped() {
                return Some((Err(stopped), false));
            }
            let due = self
                .shared
                .in_flight()
                .front()
                .map(|sent| sent.at.max(self.progress_at) + self.ttl);
            let wait_due = async {
                match due {
                    Some(due) => tokio::time::sleep_until(due).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                reply = self.replies.message() => return self.answer(reply),
                () = wait_due => {
                    return Some((
                        Err(network(StreamFault(format!(
                            "no append reply from node {} within {} ms",
                            self.link.to,
                            self.ttl.as_millis()
                        )))),
                        false,
                    ));
                }
                () = self.shared.changed.notified() => {}
            }
        }
    }

    fn answer(&mut self, reply: Result<Option<RaftBytes>, tonic::Status>) -> Option<(Item, bool)> {
        let bytes = match reply {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                let unanswered = self.shared.in_flight().len();
                if unanswered == 0 {
                    // The request side ended and every request was answered.
                    return self.shared.take_stopped().map(|e| (Err(e), false));
                }
                return Some((
                    Err(network(StreamFault(format!(
                        "append stream closed with {unanswered} requests unanswered"
                    )))),
                    false,
                ));
            }
            Err(status) => return Some((Err(network(status)), false)),
        };
        if let Some(cut) = self.link.cut() {
            return Some((Err(cut), false));
        }
        let Some(sent) = self.shared.in_flight().pop_front() else {
            return Some((
                Err(network(StreamFault(
                    "an append reply with no request".into(),
                ))),
                false,
            ));
        };
        self.progress_at = Instant::now();
        let response: AppendEntriesResponse<TypeConfig> = match decode_raft(&bytes.payload) {
            Ok(response) => response,
            Err(error) => return Some((Err(network(error)), false)),
        };
        let (result, go_on) = settle(sent, response);
        Some((Ok(result), go_on))
    }
}

/// The follower's reply to `sent` as openraft's stream result, and whether the pipeline goes
/// on: not after a conflict or a higher vote, nor after a follower took only part of a request
/// (the requests after it do not follow on from what it holds).
fn settle(
    sent: Sent,
    response: AppendEntriesResponse<TypeConfig>,
) -> (StreamAppendResult<TypeConfig>, bool) {
    let partial = matches!(
        &response,
        AppendEntriesResponse::PartialSuccess(matched) if *matched != sent.last
    );
    let result = response.into_stream_result(sent.prev, sent.last);
    let go_on = result.is_ok() && !partial;
    (result, go_on)
}

#[cfg(test)]
mod tests {
    use openraft::raft::StreamAppendError;
    use openraft::type_config::alias::{LeaderIdOf, VoteOf};
    use openraft::vote::RaftLeaderIdExt;

    use super::*;

    fn log_id(index: u64) -> LogId {
        LogId::new(LeaderIdOf::<TypeConfig>::new_committed(1, 1), index)
    }

    fn sent(prev: u64, last: u64) -> Sent {
        Sent {
            prev: Some(log_id(prev)),
            last: Some(log_id(last)),
            at: Instant::now(),
        }
    }

    #[test]
    fn a_reply_settles_its_request_and_only_a_full_success_keeps_the_pipeline_going() {
        let (result, go_on) = settle(sent(4, 9), AppendEntriesResponse::Success);
        assert_eq!(result, Ok(Some(log_id(9))));
        assert!(go_on);
        let (result, go_on) = settle(
            sent(4, 9),
            AppendEntriesResponse::PartialSuccess(Some(log_id(9))),
        );
        assert_eq!(result, Ok(Some(log_id(9))));
        assert!(go_on, "a partial success that reached the end is a success");
        let (result, go_on) = settle(
            sent(4, 9),
            AppendEntriesResponse::PartialSuccess(Some(log_id(6))),
        );
        assert_eq!(result, Ok(Some(log_id(6))));
        assert!(!go_on, "the requests after a partial one do not follow on");
        let (result, go_on) = settle(sent(4, 9), AppendEntriesResponse::Conflict);
        assert_eq!(result, Err(StreamAppendError::Conflict(log_id(4))));
        assert!(!go_on);
        let higher = VoteOf::<TypeConfig>::new_committed(2, 3);
        let (result, go_on) = settle(sent(4, 9), AppendEntriesResponse::HigherVote(higher));
        assert!(matches!(result, Err(StreamAppendError::HigherVote(_))));
        assert!(!go_on);
    }

    fn link(faults: Arc<NetworkFaults>) -> Link {
        Link {
            from: 1,
            to: 2,
            faults,
            broken: Arc::default(),
        }
    }

    fn append(prev: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: VoteOf::<TypeConfig>::new_committed(1, 1),
            prev_log_id: Some(log_id(prev)),
            leader_commit: None,
            entries: vec![],
        }
    }

    #[tokio::test]
    async fn the_request_side_records_each_request_and_stops_when_the_replies_are_dropped() {
        let shared = Arc::new(Shared::default());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let rx = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
        let mut requests = Box::pin(requests(
            rx,
            link(Arc::new(NetworkFaults::default())),
            shared.clone(),
        ));
        tx.send(append(3)).expect("send");
        assert!(requests.next().await.is_some());
        assert_eq!(shared.in_flight().len(), 1, "the request is in flight");
        // openraft has no request ready; the replies go away (the session ended).
        let waiting = tokio::spawn(async move { requests.next().await.is_none() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        shared.close();
        let ended = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the request side stopped waiting")
            .expect("joined");
        assert!(ended, "no request is taken once the replies are gone");
        tx.send(append(3))
            .expect_err("the input was dropped with the request side");
    }

    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn a_cut_link_stops_the_request_side_and_says_why() {
        let faults = Arc::new(NetworkFaults::default());
        let shared = Arc::new(Shared::default());
        let input = futures_util::stream::iter([append(3), append(3)]);
        let mut requests = Box::pin(requests(input, link(faults.clone()), shared.clone()));
        assert!(requests.next().await.is_some());
        faults.cut_one_way(1, 2);
        assert!(
            requests.next().await.is_none(),
            "nothing crosses a cut link"
        );
        assert!(matches!(
            shared.take_stopped(),
            Some(RPCError::Unreachable(_))
        ));
    }
}
