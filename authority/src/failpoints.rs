//! The node's failpoints (docs/architecture.md "Failpoints"), compiled in only with the `failpoints`
//! feature. One list, keyed by command kind (`Command::name()`, e.g. `capture_invocation`):
//!
//! | point | where |
//! |---|---|
//! | `log.after_append` | raft-store, after the append's fsync, before openraft's callback |
//! | `apply.before.<kind>` | state machine, before the router applies a batch holding `<kind>` |
//! | `apply.after.<kind>` | state machine, applied, no responder answered yet |
//! | `reply.before_send.<kind>` | Budget service, decided, reply not yet sent |
//!
//! They are configured once at start-up from `FAILPOINTS` (`name=actions;name=actions`, the
//! `fail` crate's syntax, e.g. `apply.after.capture_invocation=1*return`). The `return` action
//! aborts the process (`std::process::abort()`), so "kill the leader mid-capture" is a
//! precise, repeatable event.
//!
//! Compiling them in is not enough to arm them: the test and chaos crates turn the feature on,
//! so a workspace-wide build compiles it into `tally-node` too. Only a binary that calls
//! [`enable`] at start-up (`chaos-node`) reads `FAILPOINTS` or accepts `Admin.SetFailpoints`;
//! in any other, the points cost one relaxed atomic load and can never fire.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

use tally_ledger::Command;
pub use tally_raft_store::failpoint::{abort_if_armed, LOG_AFTER_APPEND};

/// The environment variable the points are read from.
pub const ENV: &str = "FAILPOINTS";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Lets this process arm failpoints. Called by `chaos-node` before anything else; never by
/// `tally-node`.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether this process may arm failpoints (see [`enable`]).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

#[derive(Debug, thiserror::Error)]
#[error("bad {ENV} entry {entry:?}: {reason}")]
pub struct FailpointConfigError {
    pub entry: String,
    pub reason: String,
}

/// Arms every point named in `FAILPOINTS`; returns the `(name, actions)` pairs armed.
/// Parsed here (rather than by `fail::FailScenario::setup`) so a typo is an error, not a panic.
pub fn configure_from_env() -> Result<Vec<(String, String)>, FailpointConfigError> {
    match std::env::var(ENV) {
        Ok(spec) => configure(&spec),
        Err(_) => Ok(Vec::new()),
    }
}

/// Arms `name=actions;…`.
pub fn configure(spec: &str) -> Result<Vec<(String, String)>, FailpointConfigError> {
    let mut armed = Vec::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let error = |reason: String| FailpointConfigError {
            entry: entry.to_owned(),
            reason,
        };
        let (name, actions) = entry
            .split_once('=')
            .ok_or_else(|| error("expected name=actions".to_owned()))?;
        fail::cfg(name.trim(), actions.trim()).map_err(error)?;
        armed.push((name.trim().to_owned(), actions.trim().to_owned()));
    }
    Ok(armed)
}

/// The command kinds in one apply batch, each once, in name order; none unless [`enabled`],
/// so a node that cannot arm failpoints does not walk every batch on the apply and request
/// paths to build a set nobody reads.
pub fn kinds<'a>(commands: impl IntoIterator<Item = &'a Command>) -> BTreeSet<&'static str> {
    if !enabled() {
        return BTreeSet::new();
    }
    commands.into_iter().map(Command::name).collect()
}

/// Evaluates `<stage>.<kind>` for every kind (none unless [`enabled`]: see [`kinds`]).
pub fn hit_kinds(stage: &str, kinds: &BTreeSet<&'static str>) {
    for kind in kinds {
        abort_if_armed(&format!("{stage}.{kind}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_typos_are_errors_not_panics() {
        let armed = configure("test.failpoints.a=1*off; test.failpoints.b=off").expect("valid");
        assert_eq!(
            armed,
            vec![
                ("test.failpoints.a".to_owned(), "1*off".to_owned()),
                ("test.failpoints.b".to_owned(), "off".to_owned())
            ]
        );
        assert!(configure("no-equals-sign").is_err());
        assert!(configure("test.failpoints.c=bogus(").is_err());
        assert!(configure("").expect("empty is fine").is_empty());
    }

    #[test]
    fn kinds_are_the_command_names_once_each() {
        // As in chaos-node; harmless to other tests: no point is armed by enabling.
        enable();
        let command = Command::ExpireHolds {
            family_id: "f".into(),
            up_to_ms: 1,
        };
        let kinds = kinds([&command, &command]);
        assert_eq!(kinds.into_iter().collect::<Vec<_>>(), vec!["expire_holds"]);
        // An unarmed point does nothing.
        hit_kinds("apply.after", &BTreeSet::from(["expire_holds"]));
    }
}
