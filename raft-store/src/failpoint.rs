//! Failpoints (docs/architecture.md "Failpoints"), compiled in only with the `failpoints` feature.
//!
//! A point armed with the `return` action kills the process on the spot with
//! `std::process::abort()`: a panic inside a tokio task would only end that task, and the
//! chaos harness needs "the node died exactly here". Other `fail` actions (`sleep`, `pause`,
//! `print`, …) work as the `fail` crate documents them.

/// The log store's one point: after the append's fsync, before openraft hears of it.
pub const LOG_AFTER_APPEND: &str = "log.after_append";

/// Evaluates the failpoint `name`; aborts the process when its action is `return`.
pub fn abort_if_armed(name: &str) {
    if fail::eval(name, |_| ()).is_some() {
        eprintln!("failpoint {name} fired: aborting the process");
        std::process::abort();
    }
}
