//! A Tally authority node. So far: the replicated state machine that applies committed log
//! entries to one actor per budget family (`state_machine`).

pub mod state_machine;
