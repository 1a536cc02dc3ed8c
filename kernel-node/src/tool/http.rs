//! Tool servers reached over HTTP with JSON: `POST {path}` with `{"tool", "arguments"}`,
//! answered by `{"content", "cost"?}` or `{"error": {"kind", "message"}}`. A small HTTP/1.1
//! client on a plain TCP stream (one request per connection, bounded response), so the node
//! needs no HTTP stack. A connection that could not be opened carried nothing: the tool was
//! provably not entered. Anything after the first byte was sent counts as entered.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{ToolError, ToolOutput, ToolServer};
use crate::money::Money;

/// Largest response body read from a tool server.
pub const MAX_HTTP_RESPONSE_BYTES: usize = 1024 * 1024;
/// Largest request body (the arguments) sent.
pub const MAX_HTTP_REQUEST_BYTES: usize = 1024 * 1024;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("tool server URL {url:?}: {detail}")]
pub struct HttpUrlError {
    pub url: String,
    pub detail: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpToolServer {
    id: String,
    tools: Vec<String>,
    host: String,
    port: u16,
    path: String,
}

#[derive(Deserialize)]
struct Reply {
    #[serde(default)]
    content: Value,
    cost: Option<Money>,
    error: Option<ReplyError>,
}

#[derive(Deserialize)]
struct ReplyError {
    kind: String,
    #[serde(default)]
    message: String,
}

impl HttpToolServer {
    /// `url` is `http://host:port/path` (plain HTTP; put TLS in a sidecar).
    pub fn new(id: &str, tools: Vec<String>, url: &str) -> Result<Self, HttpUrlError> {
        let error = |detail: &str| HttpUrlError {
            url: url.to_owned(),
            detail: detail.to_owned(),
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| error("only http:// is supported"))?;
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| error("a port is required"))?;
        let port = port.parse().map_err(|_| error("bad port"))?;
        if host.is_empty() {
            return Err(error("empty host"));
        }
        Ok(Self {
            id: id.to_owned(),
            tools,
            host: host.to_owned(),
            port,
            path: path.to_owned(),
        })
    }

    fn request_bytes(&self, tool: &str, arguments: &Value) -> Result<Vec<u8>, ToolError> {
        let body = json!({ "tool": tool, "arguments": arguments }).to_string();
        if body.len() > MAX_HTTP_REQUEST_BYTES {
            return Err(ToolError::NotDelivered(format!(
                "arguments are {} bytes; at most {MAX_HTTP_REQUEST_BYTES}",
                body.len()
            )));
        }
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.path,
            self.host,
            self.port,
            body.len()
        );
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body.as_bytes());
        Ok(bytes)
    }
}

/// Status code and body of a complete HTTP/1.1 response read to EOF.
fn parse_response(raw: &[u8]) -> Result<(u16, &[u8]), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| "headers are not UTF-8")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or("no status code")?;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err("chunked responses are not supported".into());
    }
    Ok((status, &raw[split + 4..]))
}

fn reply_to_result(status: u16, body: &[u8]) -> Result<ToolOutput, ToolError> {
    let reply: Reply = serde_json::from_slice(body).map_err(|e| {
        ToolError::Failed(format!(
            "HTTP {status}: response is not the expected JSON: {e}"
        ))
    })?;
    if let Some(error) = reply.error {
        let message = error.message;
        return Err(match error.kind.as_str() {
            "url_elicitation_required" => ToolError::UrlElicitationRequired { message },
            "cancelled" => ToolError::Cancelled(message),
            "incomplete" => ToolError::Incomplete(message),
            "tool_not_registered" => ToolError::ToolNotRegistered(message),
            _ => ToolError::Failed(message),
        });
    }
    if status != 200 {
        return Err(ToolError::Failed(format!("HTTP {status}")));
    }
    Ok(ToolOutput {
        content: reply.content,
        cost: reply.cost,
    })
}

#[async_trait]
impl ToolServer for HttpToolServer {
    fn id(&self) -> &str {
        &self.id
    }

    fn has_tool(&self, tool: &str) -> bool {
        self.tools.iter().any(|t| t == tool)
    }

    async fn call(&self, tool: &str, arguments: &Value) -> Result<ToolOutput, ToolError> {
        let request = self.request_bytes(tool, arguments)?;
        let mut stream = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| {
                ToolError::NotDelivered(format!("connect {}:{}: {e}", self.host, self.port))
            })?;
        stream
            .write_all(&request)
            .await
            .map_err(|e| ToolError::Failed(format!("sending the call: {e}")))?;
        let mut raw = Vec::new();
        let limit = u64::try_from(MAX_HTTP_RESPONSE_BYTES).unwrap_or(u64::MAX) + 1;
        (&mut stream)
            .take(limit)
            .read_to_end(&mut raw)
            .await
            .map_err(|e| ToolError::Failed(format!("reading the reply: {e}")))?;
        if raw.len() > MAX_HTTP_RESPONSE_BYTES {
            return Err(ToolError::Failed(format!(
                "reply over {MAX_HTTP_RESPONSE_BYTES} bytes"
            )));
        }
        let (status, body) = parse_response(&raw).map_err(ToolError::Failed)?;
        reply_to_result(status, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_replies() {
        let server =
            HttpToolServer::new("s", vec!["t".into()], "http://127.0.0.1:8080/call").expect("url");
        assert_eq!((server.port, server.path.as_str()), (8080, "/call"));
        assert!(HttpToolServer::new("s", vec![], "https://x:1/").is_err());
        assert!(HttpToolServer::new("s", vec![], "http://x/").is_err());
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{\"content\":1,\"cost\":{\"units\":5,\"currency\":\"USD\"}}";
        let (status, body) = parse_response(raw).expect("parse");
        let output = reply_to_result(status, body).expect("ok");
        assert_eq!(output.cost, Some(Money::new(5, "USD")));
        let error = br#"{"error":{"kind":"url_elicitation_required","message":"go"}}"#;
        assert!(matches!(
            reply_to_result(409, error),
            Err(ToolError::UrlElicitationRequired { .. })
        ));
        assert!(matches!(
            reply_to_result(500, b"{}"),
            Err(ToolError::Failed(_))
        ));
    }
}
