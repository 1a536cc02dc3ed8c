//! Counters a kernel node exports on `/metrics` in the Prometheus text format, served by a
//! minimal HTTP responder (one short request per connection, bounded).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Request bytes read from a scraper before answering.
pub const MAX_METRICS_REQUEST_BYTES: usize = 8 * 1024;

#[derive(Debug, Default)]
pub struct Metrics {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub url_elicitations: AtomicU64,
    pub admissions: AtomicU64,
    pub completions: AtomicU64,
    pub aborts: AtomicU64,
    pub invalid_requests: AtomicU64,
    /// New calls refused because the receipt log failed (fail closed).
    pub receipt_log_refusals: AtomicU64,
    /// Set once the receipt log failed; the node stays unhealthy until restarted.
    pub receipt_log_failed: AtomicBool,
}

impl Metrics {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let line = |name: &str, help: &str, labels: &str, value: &AtomicU64| {
            format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{labels} {}\n",
                value.load(Ordering::Relaxed)
            )
        };
        [
            line(
                "tally_kernel_evaluations_total",
                "Evaluations by verdict.",
                "{verdict=\"allow\"}",
                &self.allowed,
            ),
            format!(
                "tally_kernel_evaluations_total{{verdict=\"deny\"}} {}\n",
                self.denied.load(Ordering::Relaxed)
            ),
            line(
                "tally_kernel_url_elicitations_total",
                "Calls a server deferred for a URL visit.",
                "",
                &self.url_elicitations,
            ),
            line(
                "tally_kernel_admissions_total",
                "Two-phase admissions with a ticket.",
                "",
                &self.admissions,
            ),
            line(
                "tally_kernel_completions_total",
                "Two-phase completions.",
                "",
                &self.completions,
            ),
            line(
                "tally_kernel_aborts_total",
                "Two-phase aborts.",
                "",
                &self.aborts,
            ),
            line(
                "tally_kernel_invalid_requests_total",
                "Requests the node could not read.",
                "",
                &self.invalid_requests,
            ),
            line(
                "tally_kernel_receipt_log_refusals_total",
                "New calls refused because the receipt log failed.",
                "",
                &self.receipt_log_refusals,
            ),
            format!(
                "# HELP tally_kernel_receipt_log_healthy 1 while receipts are appended; 0 once an append failed (no new calls are taken).\n# TYPE tally_kernel_receipt_log_healthy gauge\ntally_kernel_receipt_log_healthy {}\n",
                u8::from(!self.receipt_log_failed.load(Ordering::Relaxed))
            ),
        ]
        .concat()
    }
}

/// Serves `metrics` at any path of `listener` until the task is aborted.
pub(super) async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    while let Ok((mut stream, _)) = listener.accept().await {
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let mut buffer = vec![0u8; MAX_METRICS_REQUEST_BYTES];
            let mut read = 0;
            while read < buffer.len() {
                match stream.read(&mut buffer[read..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
                if buffer[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let body = metrics.render();
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

pub(super) async fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(address).await
}
