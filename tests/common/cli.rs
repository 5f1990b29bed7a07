//! The built binary as a client command, as people and scripts run it: one
//! call to completion ([`subagentd`], [`subagentd_async`]), or a long-running
//! one such as `watch` whose stdout is read line by line ([`CliChild`]).
//!
//! `SUBAGENTD_ADDR` is removed from the environment, so the only server a
//! command reaches is the one its `--addr` names.

use std::process::{Command, Output, Stdio};

use tokio::{
    io::{AsyncBufReadExt, BufReader, Lines},
    process::{Child, ChildStdout},
};

use super::child::CHILD_WAIT;

/// Runs `subagentd ARGS` to completion.
pub fn subagentd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_subagentd"))
        .args(args)
        .env_remove("SUBAGENTD_ADDR")
        .output()
        .expect("binary runs")
}

/// [`subagentd`] off the runtime's workers; panics if it runs longer than
/// [`CHILD_WAIT`].
pub async fn subagentd_async(args: Vec<String>) -> Output {
    let call = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        subagentd(&args)
    });
    tokio::time::timeout(CHILD_WAIT, call)
        .await
        .expect("the command ends in time")
        .unwrap()
}

/// Its stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Its stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A client command that keeps running (`watch`), killed when dropped.
pub struct CliChild {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl CliChild {
    /// Starts `subagentd ARGS` with stdout piped.
    pub fn start(args: &[&str]) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagentd"))
            .args(args)
            .env_remove("SUBAGENTD_ADDR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("binary runs");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// The next line of its stdout; panics if none arrives within 10 s or
    /// the command ended.
    pub async fn next_line(&mut self) -> String {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("a line within 10 s")
            .unwrap()
            .expect("the command is still running")
    }

    /// The next line, parsed as JSON (for `--json`).
    pub async fn next_json(&mut self) -> serde_json::Value {
        let line = self.next_line().await;
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// Kills it and waits for it to exit.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}
