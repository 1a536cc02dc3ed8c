//! In-process tool servers with scripted behaviour, the seed's test doubles: each counts the
//! times it was entered, so a test can assert "exactly one dispatch".

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{ToolError, ToolOutput, ToolServer};
use crate::money::Money;

/// What a [`ScriptedServer`] does once entered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Answers, reporting `cost` (the seed's `CountingMonetaryServer`/`MonetaryCostServer`).
    Succeed {
        cost: Option<Money>,
    },
    /// Never answers (the seed's `HangingToolServer`): the kernel's deadline fires.
    Hang,
    /// Side effect, then each failure of the seed's post-dispatch servers.
    CancelAfterSideEffect,
    IncompleteAfterSideEffect,
    FailAfterSideEffect,
    ToolNotRegisteredAfterDispatch,
    /// Says it needs a URL visited before its side effect (the seed counts the call anyway).
    UrlElicitation {
        message: String,
    },
}

pub struct ScriptedServer {
    id: String,
    tools: Vec<String>,
    behavior: Behavior,
    invocations: Arc<AtomicU64>,
}

impl ScriptedServer {
    pub fn new(id: &str, tools: &[&str], behavior: Behavior) -> Self {
        Self {
            id: id.to_owned(),
            tools: tools.iter().map(|t| (*t).to_owned()).collect(),
            behavior,
            invocations: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Shares a counter the test keeps.
    pub fn with_counter(mut self, invocations: Arc<AtomicU64>) -> Self {
        self.invocations = invocations;
        self
    }

    pub fn counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.invocations)
    }
}

#[async_trait]
impl ToolServer for ScriptedServer {
    fn id(&self) -> &str {
        &self.id
    }

    fn has_tool(&self, tool: &str) -> bool {
        self.tools.iter().any(|t| t == tool)
    }

    async fn call(&self, tool: &str, arguments: &Value) -> Result<ToolOutput, ToolError> {
        self.invocations.fetch_add(1, Ordering::SeqCst);
        match &self.behavior {
            Behavior::Succeed { cost } => Ok(ToolOutput {
                content: json!({ "tool": tool, "arguments": arguments }),
                cost: cost.clone(),
            }),
            Behavior::Hang => {
                std::future::pending::<()>().await;
                Err(ToolError::Failed("unreachable".into()))
            }
            Behavior::CancelAfterSideEffect => Err(ToolError::Cancelled("client went away".into())),
            Behavior::IncompleteAfterSideEffect => {
                Err(ToolError::Incomplete("stream ended early".into()))
            }
            Behavior::FailAfterSideEffect => Err(ToolError::Failed("tool crashed".into())),
            Behavior::ToolNotRegisteredAfterDispatch => Err(ToolError::ToolNotRegistered(format!(
                "{tool} vanished from the server"
            ))),
            Behavior::UrlElicitation { message } => Err(ToolError::UrlElicitationRequired {
                message: message.clone(),
            }),
        }
    }
}

/// Request bytes one test HTTP server reads per connection.
const MAX_TEST_REQUEST_BYTES: usize = 1024 * 1024;

/// An HTTP JSON tool server on 127.0.0.1 (port 0) answering every call as `behavior` says,
/// for tests of [`super::HttpToolServer`] and the `tally-kernel` binary. Returns its address
/// and entry counter; it serves until the runtime ends or the handle is aborted.
pub async fn spawn_http_tool_server(
    behavior: Behavior,
) -> std::io::Result<(
    std::net::SocketAddr,
    Arc<AtomicU64>,
    tokio::task::JoinHandle<()>,
)> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let address = listener.local_addr()?;
    let counter = Arc::new(AtomicU64::new(0));
    let invocations = Arc::clone(&counter);
    let handle = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let behavior = behavior.clone();
            let invocations = Arc::clone(&invocations);
            tokio::spawn(async move {
                let _ = answer(stream, behavior, invocations).await;
            });
        }
    });
    Ok((address, counter, handle))
}

async fn answer(
    mut stream: tokio::net::TcpStream,
    behavior: Behavior,
    invocations: Arc<AtomicU64>,
) -> std::io::Result<()> {
    let Some(call) = read_json_request(&mut stream, MAX_TEST_REQUEST_BYTES).await? else {
        return Ok(());
    };
    invocations.fetch_add(1, Ordering::SeqCst);
    let error =
        |kind: &str, message: &str| json!({ "error": { "kind": kind, "message": message } });
    let (status, reply) = match behavior {
        Behavior::Succeed { cost } => (200, json!({ "content": call, "cost": cost })),
        Behavior::Hang => {
            std::future::pending::<()>().await;
            return Ok(());
        }
        Behavior::CancelAfterSideEffect => (499, error("cancelled", "client went away")),
        Behavior::IncompleteAfterSideEffect => (502, error("incomplete", "stream ended early")),
        Behavior::FailAfterSideEffect => (500, error("failed", "tool crashed")),
        Behavior::ToolNotRegisteredAfterDispatch => {
            (404, error("tool_not_registered", "tool vanished"))
        }
        Behavior::UrlElicitation { message } => (409, error("url_elicitation_required", &message)),
    };
    write_json_reply(&mut stream, status, &reply).await
}

/// Reads one HTTP/1.1 request from a test tool server's connection: the head, then a body of
/// `Content-Length` bytes, both within `max_bytes`. The body parsed as JSON (`Null` if it is
/// not JSON), or `None` when the peer closed first or the head is over the limit.
pub async fn read_json_request(
    stream: &mut tokio::net::TcpStream,
    max_bytes: usize,
) -> std::io::Result<Option<Value>> {
    use tokio::io::AsyncReadExt;
    let mut raw = Vec::new();
    let mut buffer = [0u8; 4096];
    let body_start = loop {
        let n = stream.read(&mut buffer).await?;
        if n == 0 || raw.len() > max_bytes {
            return Ok(None);
        }
        raw.extend_from_slice(&buffer[..n]);
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&raw[..body_start]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
        .min(max_bytes);
    while raw.len() < body_start + length {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            return Ok(None);
        }
        raw.extend_from_slice(&buffer[..n]);
    }
    Ok(Some(
        serde_json::from_slice(&raw[body_start..body_start + length]).unwrap_or(Value::Null),
    ))
}

/// Writes a JSON reply with `status` and closes the connection.
pub async fn write_json_reply(
    stream: &mut tokio::net::TcpStream,
    status: u16,
    reply: &Value,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let body = reply.to_string();
    let response = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
