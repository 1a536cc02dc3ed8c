//! Tally's chaos harness (docs/chaos.md): real node processes behind fault-injecting proxies,
//! a seeded workload and seeded nemeses, a recorded history, and a pure checker for
//! docs/spec.md §11.
//!
//! Run it with `cargo run -p tally-chaos --bin tally-chaos -- run --profile ci --seed 42`
//! (about two minutes; `--profile soak --duration-s 3600` for longer). It writes
//! `summary.txt`, `report.json`, `history.json`, `timeline.png` and the nodes' data dirs and
//! logs under `--out` (default `target/chaos/<profile>-<seed>`), prints the summary with the
//! command that replays the run, and exits 0 only when every invariant held.
//!
//! | module | concern |
//! |---|---|
//! | `proxy` | the fault-injecting TCP proxy in front of each node |
//! | `process`, `cluster` | node processes (kill, pause, restart) and the cluster under test |
//! | `workload` | the seeded, kernel-like request flows through tally-client |
//! | `kernel`, `kernel_workload` | kernel processes, shared rail and tool server, `EvaluateToolCall` flows |
//! | `nemesis` | the seeded fault schedule, incl. failpoint kills of the leader |
//! | `history`, `checker` | the recorded history and the pure docs/spec.md §11 checker |
//! | `paged_read` | reading a whole list page by page for the final check |
//! | `journal` | following the families' events during the run, before compaction removes them |
//! | `leader_watch`, `report`, `timeline` | who led, the summary/JSON, the PNG |
//! | `run`, `profile`, `cli` | one run end to end, its profiles and command line |

pub mod checker;
pub mod cli;
pub mod cluster;
pub mod history;
pub mod journal;
pub mod kernel;
pub mod kernel_workload;
pub mod leader_watch;
pub mod listen_port;
pub mod nemesis;
pub mod paged_read;
pub mod process;
pub mod profile;
pub mod proxy;
pub mod report;
pub mod run;
pub mod timeline;
pub mod workload;
