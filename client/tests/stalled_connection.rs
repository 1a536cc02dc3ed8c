//! A node that takes a connection and never answers on it (what a connection looks like after
//! a network cut heals, until TCP's next backed-off retransmission) costs an attempt its
//! timeout, not every attempt after it: the client drops a channel that gave no answer, so its
//! next attempt opens a fresh connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_client::{ClientConfig, Outcome, TallyClient, Transport};
use tally_ledger::{ClientCommand, CommandHeader, GrantLimits, Operation};

fn authorize() -> ClientCommand {
    ClientCommand {
        header: CommandHeader {
            family_id: "fam".into(),
            capability_id: "cap".into(),
            grant_index: 0,
            event_id: "h1:authorize".into(),
            not_after_ms: tally_client::wall_clock_ms() + 60_000,
        },
        op: Operation::AuthorizeHold {
            hold_id: "h1".into(),
            requested_exposure_units: 10,
            limits: GrantLimits::monetary(None, Some(100), None, "USD"),
            ancestors: vec![],
            hold_timeout_ms: None,
        },
    }
}

#[tokio::test]
async fn an_attempt_with_no_answer_makes_the_next_one_open_a_fresh_connection() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(Mutex::new(Vec::new()));
    {
        let (accepted, held) = (accepted.clone(), held.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                // Kept open, never read or written: the peer hears nothing.
                held.lock().expect("held").push(stream);
            }
        });
    }
    let mut config = ClientConfig::new(vec![address], Transport::Insecure);
    config.attempt_timeout = Duration::from_millis(200);
    config.retry_for = Duration::from_millis(900);
    config.resolve_for = Duration::from_millis(300);
    config.backoff_min = Duration::from_millis(10);
    config.backoff_max = Duration::from_millis(20);
    let client = TallyClient::new(config).expect("client");

    let outcome = client.submit(authorize()).await;
    assert!(
        matches!(
            outcome,
            Outcome::Unknown { .. } | Outcome::Unavailable { .. }
        ),
        "a node that never answers decides nothing: {outcome:?}"
    );
    let connections = accepted.load(Ordering::SeqCst);
    assert!(
        connections >= 3,
        "each attempt after one that got no answer opened a fresh connection: {connections}"
    );
}
