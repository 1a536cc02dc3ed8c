//! The tool servers a kernel node may dispatch to, by server id. Built at start-up from config
//! and never changed while serving, so every kernel node with the same config dispatches alike.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::ToolServer;

/// Servers one kernel node knows.
pub const MAX_TOOL_SERVERS: usize = 1_024;

#[derive(Clone, Default)]
pub struct ToolRegistry {
    servers: BTreeMap<String, Arc<dyn ToolServer>>,
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a server under its id.
    pub fn register(&mut self, server: Arc<dyn ToolServer>) {
        assert!(
            self.servers.len() < MAX_TOOL_SERVERS || self.servers.contains_key(server.id()),
            "more than {MAX_TOOL_SERVERS} tool servers"
        );
        self.servers.insert(server.id().to_owned(), server);
    }

    /// The server that offers `tool`, if it is registered here.
    pub fn lookup(&self, server: &str, tool: &str) -> Option<Arc<dyn ToolServer>> {
        self.servers
            .get(server)
            .filter(|s| s.has_tool(tool))
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }
}
