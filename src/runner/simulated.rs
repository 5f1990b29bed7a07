//! The `simulated` runner: a tiny script language in the prompt that makes
//! every state reachable for demos and tests.
//!
//! One directive per line:
//! - `sleep <ms>` waits (cancellable);
//! - `output <text>` appends a line to the result;
//! - `tool <name>` reports a tool call;
//! - `usage <input> <output>` adds tokens;
//! - `approve <tool_name>` pauses in AWAITING_APPROVAL; once decided and
//!   running again it appends `approved: <tool>` or `denied: <tool>: <note>`;
//! - `fail <message>` ends FAILED with that message;
//! - `wait_steer` waits until a steer message has arrived: one that
//!   arrived earlier (during a `sleep`, say) and has not satisfied an
//!   earlier `wait_steer` counts, so it goes on at once; otherwise it waits
//!   for the next one. Each `wait_steer` consumes one steer: two need two;
//! - `history` appends the earlier turns of the agent's conversation (a
//!   continuation's history), one line per transcript entry:
//!   `turn <n> <kind>: <text>` with kind `prompt`, `steer`, `tool`,
//!   `result` (or `failed`/`cancelled`), newlines in the text shown as
//!   `\n`; first `elided: <notice>` when older entries were elided;
//!   `history: none` on a conversation's first turn;
//! - `fail_on <provider/model> <status>`: when the run is on that model,
//!   fails like a provider answering HTTP `<status>` (code
//!   `PROVIDER_<status>`; retryable for `fallback_models` as the openai
//!   runner's: 429, 5xx, 401, 403, 404); on any other model, nothing;
//! - `turn` starts a turn of the agent's loop (`[agents.NAME] max_turns`):
//!   the first turn past `max_turns` appends `wrap-up: <wrap_up_message>`;
//!   a turn past `max_turns + grace_turns` ends the run FAILED `TURN_LIMIT`;
//! - any other line is appended to the result as is.
//!
//! Each steer message received appends `steer: <message>` once, when it is
//! received (during a `sleep`, a `wait_steer` or at the end of the script).
//! A prompt with no directives finishes at once with the prompt as its
//! result.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{Run, RunOutcome, RunReporter, Runner};
use crate::scheduler::{
    conversation::{EntryKind, History},
    AgentError, AgentStatus, TurnVerdict, Usage, CODE_RUN_FAILED,
};

/// See the module docs.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimulatedRunner;

impl Runner for SimulatedRunner {
    fn run(&self, run: Run) -> BoxFuture<'static, RunOutcome> {
        Box::pin(simulate(run))
    }
}

/// One parsed prompt line.
#[derive(Debug, PartialEq, Eq)]
enum Directive<'a> {
    Sleep(u64),
    Output(&'a str),
    Tool(&'a str),
    Usage(u64, u64),
    Approve(&'a str),
    Fail(&'a str),
    WaitSteer,
    History,
    Turn,
    FailOn(&'a str, u16),
    Text(&'a str),
}

fn parse(line: &str) -> Directive<'_> {
    let trimmed = line.trim();
    let (word, rest) = trimmed.split_once(' ').unwrap_or((trimmed, ""));
    let rest = rest.trim();
    match word {
        "sleep" => rest.parse().map_or(Directive::Text(line), Directive::Sleep),
        "output" => Directive::Output(rest),
        "tool" if !rest.is_empty() => Directive::Tool(rest),
        "usage" => {
            let mut parts = rest.split_whitespace().map(str::parse::<u64>);
            match (parts.next(), parts.next(), parts.next()) {
                (Some(Ok(i)), Some(Ok(o)), None) => Directive::Usage(i, o),
                _ => Directive::Text(line),
            }
        }
        "approve" if !rest.is_empty() => Directive::Approve(rest),
        "fail" => Directive::Fail(rest),
        "wait_steer" if rest.is_empty() => Directive::WaitSteer,
        "history" if rest.is_empty() => Directive::History,
        "turn" if rest.is_empty() => Directive::Turn,
        "fail_on" => match rest.split_whitespace().collect::<Vec<_>>()[..] {
            [model, status] => status
                .parse()
                .map_or(Directive::Text(line), |s| Directive::FailOn(model, s)),
            _ => Directive::Text(line),
        },
        _ => Directive::Text(line),
    }
}

async fn simulate(run: Run) -> RunOutcome {
    let Run {
        prompt,
        steer: mut inbox,
        reporter,
        history,
        agent,
        ..
    } = run;
    let model_of_run = agent.model;
    let has_directives = prompt
        .lines()
        .any(|l| !matches!(parse(l), Directive::Text(_)));
    if !has_directives {
        let mut result = prompt.to_string();
        while let Some(msg) = inbox.try_recv() {
            result.push('\n');
            result.push_str(&steer_line(&msg));
        }
        return Ok(result);
    }
    let mut script = Transcript {
        reporter,
        lines: Vec::new(),
        unmatched_steers: 0,
    };
    for line in prompt.lines() {
        match parse(line) {
            Directive::Sleep(ms) => {
                let sleep = tokio::time::sleep(Duration::from_millis(ms));
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        () = &mut sleep => break,
                        Some(msg) = inbox.recv() => script.steered(&msg),
                    }
                }
            }
            Directive::Output(text) => script.emit(text.to_owned()),
            Directive::Text(text) => script.emit(text.to_owned()),
            Directive::Tool(name) => script.reporter.tool_call(name, ""),
            Directive::Usage(input, output) => script.reporter.usage(Usage {
                input_tokens: input,
                output_tokens: output,
                tool_calls: 0,
            }),
            Directive::Approve(tool) => {
                let outcome = script.reporter.request_approval(tool, "").await;
                let line = match (outcome.approved, outcome.note.is_empty()) {
                    (true, _) => format!("approved: {tool}"),
                    (false, true) => format!("denied: {tool}"),
                    (false, false) => format!("denied: {tool}: {}", outcome.note),
                };
                script.emit(line);
            }
            Directive::Fail(message) => {
                return Err(AgentError::new(CODE_RUN_FAILED, message));
            }
            Directive::FailOn(model, status) => {
                if *model_of_run == *model {
                    let retryable = reqwest::StatusCode::from_u16(status)
                        .is_ok_and(|s| super::openai::falls_back(s, None));
                    if retryable {
                        script.reporter.retryable_failure();
                    }
                    return Err(AgentError::new(
                        &format!("PROVIDER_{status}"),
                        format!("simulated provider error {status} on {model}"),
                    ));
                }
            }
            Directive::Turn => match script.reporter.turn_started() {
                TurnVerdict::Go => {}
                TurnVerdict::WrapUp(message) => script.emit(format!("wrap-up: {message}")),
                // Ended by the scheduler, which drops this future.
                TurnVerdict::Stop => std::future::pending().await,
            },
            Directive::History => {
                for line in history_lines(history.as_deref()) {
                    script.emit(line);
                }
            }
            Directive::WaitSteer => {
                if script.unmatched_steers == 0 {
                    match inbox.recv().await {
                        Some(msg) => script.steered(&msg),
                        // The scheduler dropped the sender: the run is ending.
                        None => std::future::pending().await,
                    }
                }
                script.unmatched_steers -= 1;
            }
        }
    }
    while let Some(msg) = inbox.try_recv() {
        script.steered(&msg);
    }
    Ok(script.lines.join("\n"))
}

/// What a script has produced so far.
struct Transcript {
    reporter: RunReporter,
    /// The result lines, in order.
    lines: Vec<String>,
    /// Steers received that no `wait_steer` has consumed yet: a
    /// `wait_steer` means "until a steer has arrived", so one that arrived
    /// during an earlier `sleep` must not be waited for again.
    unmatched_steers: usize,
}

impl Transcript {
    /// Appends a result line. Output is reported in chunks that concatenate
    /// to the result: each line after the first starts with its separating
    /// newline.
    fn emit(&mut self, text: String) {
        if self.lines.is_empty() {
            self.reporter.output(&text);
        } else {
            self.reporter.output(&format!("\n{text}"));
        }
        self.lines.push(text);
    }

    /// A steer message was received: appended once, now, and owed to the
    /// next `wait_steer`.
    fn steered(&mut self, msg: &str) {
        self.emit(steer_line(msg));
        self.unmatched_steers += 1;
    }
}

/// What the `history` directive appends.
fn history_lines(history: Option<&History>) -> Vec<String> {
    let Some(h) = history else {
        return vec!["history: none".to_owned()];
    };
    let mut lines = Vec::new();
    if h.elided.entries > 0 || h.elided.bytes > 0 {
        lines.push(format!(
            "elided: {} entries, {} bytes",
            h.elided.entries, h.elided.bytes
        ));
    }
    for (_, turn, entry) in &h.entries {
        let kind = match &entry.kind {
            EntryKind::Prompt => "prompt",
            EntryKind::Steer => "steer",
            EntryKind::ToolCall => "tool",
            EntryKind::Result { status, .. } => match status {
                AgentStatus::Failed => "failed",
                AgentStatus::Cancelled => "cancelled",
                _ => "result",
            },
        };
        let text = entry.text.replace('\n', "\\n");
        lines.push(format!("turn {turn} {kind}: {text}"));
    }
    lines
}

fn steer_line(msg: &str) -> String {
    format!("steer: {msg}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{
        AgentId, AgentStatus, AgentView, AwaitMode, Scheduler, SpawnSpec, SteerDelivery,
    };
    use futures_util::FutureExt;
    use tokio::time::Instant;

    /// A scheduler with the default config (the simulated runner), to be
    /// used under a paused clock: every `sleep` and Await timeout then
    /// passes as soon as everything else is idle.
    fn scheduler() -> Scheduler {
        Scheduler::new(
            &crate::config::ConfigSource::from_toml_str("").unwrap(),
            crate::runner::builtin(None, None),
        )
    }

    fn spawn(s: &Scheduler, prompt: &str) -> AgentId {
        s.spawn(SpawnSpec {
            agent: "simulated".into(),
            model: "acme/m".into(),
            prompt: prompt.into(),
            background: true,
            ..SpawnSpec::default()
        })
        .now_or_never()
        .expect("without a store Spawn answers at once")
        .unwrap()
        .id
    }

    /// Delivers a steer to the running run.
    fn steer(s: &Scheduler, id: AgentId, message: &str) {
        let (_, delivery) = s
            .steer(&crate::scheduler::Scope::All, id, message.into())
            .now_or_never()
            .expect("without a store Steer answers at once")
            .unwrap();
        assert_eq!(delivery, SteerDelivery::Delivered);
    }

    /// Awaits the agent for at most a minute (of the paused clock); the
    /// view and whether the minute passed first.
    async fn await_minute(s: &Scheduler, id: AgentId) -> (AgentView, bool) {
        let (mut agents, timed_out) = s
            .await_agents(
                &crate::scheduler::Scope::All,
                &[id],
                Some(Duration::from_secs(60)),
                AwaitMode::All,
            )
            .await
            .unwrap();
        (agents.pop().unwrap(), timed_out)
    }

    /// Lets the clock run to `ms` after `start`: the run is in its script.
    async fn at(start: Instant, ms: u64) {
        tokio::time::sleep_until(start + Duration::from_millis(ms)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_steer_received_during_sleep_satisfies_the_next_wait_steer() {
        let s = scheduler();
        let start = Instant::now();
        let id = spawn(&s, "sleep 2000\noutput step one\nwait_steer");
        at(start, 500).await;
        steer(&s, id, "go on");
        let (done, timed_out) = await_minute(&s, id).await;
        assert!(!timed_out, "wait_steer waited for a second steer");
        assert_eq!(done.status, AgentStatus::Done);
        assert_eq!(&*done.result, "steer: go on\nstep one", "appended once");
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(2000),
            "done when the sleep ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn steers_received_before_wait_steers_each_satisfy_one() {
        let s = scheduler();
        let start = Instant::now();
        let id = spawn(&s, "sleep 1000\nwait_steer\nwait_steer\noutput end");
        at(start, 500).await;
        steer(&s, id, "a");
        steer(&s, id, "b");
        let (done, timed_out) = await_minute(&s, id).await;
        assert!(!timed_out);
        assert_eq!(&*done.result, "steer: a\nsteer: b\nend");
        assert_eq!(start.elapsed(), Duration::from_millis(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn two_wait_steers_need_two_steers() {
        let s = scheduler();
        let start = Instant::now();
        let id = spawn(
            &s,
            "sleep 1000\nwait_steer\noutput between\nwait_steer\noutput end",
        );
        at(start, 500).await;
        steer(&s, id, "one");
        let (waiting, timed_out) = await_minute(&s, id).await;
        assert!(timed_out, "the second wait_steer waits: {waiting:?}");
        assert_eq!(waiting.status, AgentStatus::Running);
        assert_eq!(&*waiting.result, "steer: one\nbetween");
        steer(&s, id, "two");
        let (done, timed_out) = await_minute(&s, id).await;
        assert!(!timed_out);
        assert_eq!(&*done.result, "steer: one\nbetween\nsteer: two\nend");
    }

    #[tokio::test(start_paused = true)]
    async fn a_steer_that_a_wait_steer_waited_for_does_not_satisfy_the_next() {
        let s = scheduler();
        let start = Instant::now();
        let id = spawn(&s, "wait_steer\nsleep 1000\nwait_steer\noutput end");
        at(start, 500).await;
        steer(&s, id, "one");
        let (waiting, timed_out) = await_minute(&s, id).await;
        assert!(timed_out, "the second wait_steer waits: {waiting:?}");
        assert_eq!(&*waiting.result, "steer: one");
        steer(&s, id, "two");
        let (done, timed_out) = await_minute(&s, id).await;
        assert!(!timed_out);
        assert_eq!(&*done.result, "steer: one\nsteer: two\nend");
    }

    #[tokio::test(start_paused = true)]
    async fn steers_after_the_last_wait_steer_are_still_appended() {
        let s = scheduler();
        let start = Instant::now();
        let id = spawn(&s, "output start\nwait_steer\nsleep 1000");
        at(start, 500).await;
        // The first ends the wait_steer, the second arrives in the sleep.
        steer(&s, id, "one");
        at(start, 600).await;
        steer(&s, id, "two");
        let (done, _) = await_minute(&s, id).await;
        assert_eq!(&*done.result, "start\nsteer: one\nsteer: two");
    }

    #[test]
    fn directives_parse_and_anything_else_is_text() {
        assert_eq!(parse("sleep 50"), Directive::Sleep(50));
        assert_eq!(
            parse("  output hello world "),
            Directive::Output("hello world")
        );
        assert_eq!(parse("tool grep"), Directive::Tool("grep"));
        assert_eq!(parse("usage 10 20"), Directive::Usage(10, 20));
        assert_eq!(parse("approve shell"), Directive::Approve("shell"));
        assert_eq!(parse("fail boom"), Directive::Fail("boom"));
        assert_eq!(parse("wait_steer"), Directive::WaitSteer);
        assert_eq!(parse("sleep soon"), Directive::Text("sleep soon"));
        assert_eq!(parse("usage 1"), Directive::Text("usage 1"));
        assert_eq!(parse("hello"), Directive::Text("hello"));
    }
}
