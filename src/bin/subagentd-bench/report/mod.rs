//! Results as a table for people and as one JSON document for scripts, plus
//! the verdict on the targets that these measurements can decide.
//!
//! Ratios to the baseline are the numbers to read: both were measured in the
//! same run on the same machine, so the machine's noise mostly cancels.
//! Verdicts never change the exit status (no timing assertions in CI); only
//! errors and server failures do.
//!
//! The parts, their imports pointing one way: `text` (rendering) and
//! `verdicts` (targets, pass/fail) → `statistics` (percentiles, ratios,
//! medians) → `model` (the result data types, what the JSON shows).

mod model;
mod statistics;
mod text;
mod verdicts;

pub use model::{Failure, MemoryReport, MemoryRow, Row, RunReport, WatchStats};
pub use statistics::Measurement;
pub use text::{render_memory, render_run};
