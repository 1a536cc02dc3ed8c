//! Tool servers: what the kernel dispatches to once it owns a budget capture. The kernel needs
//! to know one thing about a failure: whether the tool may have been entered (docs/spec.md §9).
//! Only a failure that proves it was not ([`ToolError::is_pre_dispatch`]) may free funds.

mod http;
mod registry;
pub mod testing;

use async_trait::async_trait;
use serde_json::Value;

use crate::money::Money;

pub use http::{HttpToolServer, HttpUrlError, MAX_HTTP_REQUEST_BYTES, MAX_HTTP_RESPONSE_BYTES};
pub use registry::{ToolRegistry, MAX_TOOL_SERVERS};

/// What a tool call returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutput {
    pub content: Value,
    /// The cost the server reports; the kernel realizes `min(cost, charged)`.
    pub cost: Option<Money>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The server needs the user to visit a URL first; it says it did not run the tool.
    #[error("URL elicitation required: {message}")]
    UrlElicitationRequired { message: String },
    #[error("tool call cancelled: {0}")]
    Cancelled(String),
    #[error("tool call incomplete: {0}")]
    Incomplete(String),
    #[error("tool call failed: {0}")]
    Failed(String),
    /// Raised by the server after the kernel dispatched: the call reached it, so it counts as
    /// entered (unlike a tool missing from the kernel's own registry).
    #[error("server reports tool not registered: {0}")]
    ToolNotRegistered(String),
    /// The call never left this node (no connection could be opened): not entered.
    #[error("tool call not delivered: {0}")]
    NotDelivered(String),
}

impl ToolError {
    /// True only when the server proved the tool was not entered.
    pub fn is_pre_dispatch(&self) -> bool {
        matches!(
            self,
            Self::UrlElicitationRequired { .. } | Self::NotDelivered(_)
        )
    }
}

#[async_trait]
pub trait ToolServer: Send + Sync {
    fn id(&self) -> &str;
    fn has_tool(&self, tool: &str) -> bool;
    async fn call(&self, tool: &str, arguments: &Value) -> Result<ToolOutput, ToolError>;
}
